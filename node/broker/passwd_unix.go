//go:build unix

package broker

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// fileOwner is a file's owner and group (known false: a new file, owned
// by whoever creates it).
type fileOwner struct {
	known    bool
	uid, gid int
}

func ownerOf(fi fs.FileInfo) fileOwner {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileOwner{}
	}
	return fileOwner{known: true, uid: int(st.Uid), gid: int(st.Gid)}
}

// apply gives f the owner and group, unless they are already f's.
func (o fileOwner) apply(f *os.File) error {
	if !o.known {
		return nil
	}
	if fi, err := f.Stat(); err == nil && ownerOf(fi) == o {
		return nil
	}
	return f.Chown(o.uid, o.gid)
}

func (o fileOwner) String() string { return fmt.Sprintf("uid %d gid %d", o.uid, o.gid) }
