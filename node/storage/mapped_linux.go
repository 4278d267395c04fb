package storage

import (
	"fmt"
	"syscall"

	bolt "go.etcd.io/bbolt"
)

// ReleaseMapped drops the pages of the file's memory map from this
// process's resident set (madvise MADV_DONTNEED over the committed part of
// the map). bbolt reads values through a shared, read-only map of the file:
// every page a reader touched stays mapped, and counted in the process's
// RSS, until the map is replaced, so a daemon that reads back a whole round
// of stored updates after every round grows by the round log's size each
// round. The pages stay in the kernel's page cache; the next read maps them
// back from it (the same bytes: bbolt writes through the file, never
// through the map). It runs inside a read transaction, which holds bbolt's
// map lock: the map cannot be replaced, and its address reused, meanwhile.
func ReleaseMapped(d *DB) error {
	return d.View(func(tx *Tx) error {
		if err := releaseMapped(tx.Tx); err != nil {
			return fmt.Errorf("storage: release the map of %s: %w", d.path, err)
		}
		return nil
	})
}

// releaseMapped is ReleaseMapped inside transaction tx: a read transaction
// holds bbolt's map lock, and a write transaction is the only one that may
// replace the map, so the map stays where it is while tx runs.
func releaseMapped(tx *bolt.Tx) error {
	size := tx.Size()
	if size <= 0 {
		return nil
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, tx.DB().Info().Data, uintptr(size), syscall.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
