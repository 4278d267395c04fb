//go:build !linux

package storage

import bolt "go.etcd.io/bbolt"

// ReleaseMapped is a no-op off Linux (see mapped_linux.go).
func ReleaseMapped(*DB) error { return nil }

func releaseMapped(*bolt.Tx) error { return nil }
