package sim

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/testkit"
)

// With a schema that declares its preprocessing simulate computes no
// statistics, but a site below min_site_samples still stops the run, as
// its agent refuses to train (sitedata.Site.EnoughRows).
func TestDeclaredSchemaTooFewRows(t *testing.T) {
	dir, _ := testSites(t)
	testkit.WriteFile(t, filepath.Join(dir, "schema.json"), strings.Replace(declaredSchemaJSON, `"min_site_samples": 5`, `"min_site_samples": 50`, 1))
	cfg := schemaConfig(t, dir, "fedavg")
	_, err := Run(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "hosp-b") || !strings.Contains(err.Error(), "min_site_samples 50") {
		t.Fatalf("a site below min_site_samples: %v", err)
	}
}
