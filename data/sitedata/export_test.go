package sitedata

// The package's test helpers, lent to its external tests (bundle_test.go).
var (
	SchemaForTest = testSchema
	SitesForTest  = sites
	PooledForTest = pooled
)
