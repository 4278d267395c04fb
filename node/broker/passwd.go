package broker

import (
	"bufio"
	"bytes"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/proto/wire"
)

// Password file format
//
// One entry per line, "username:hash", in Mosquitto's format (so the same
// file serves the embedded broker and `password_file` of Mosquitto >= 2.0,
// and `mosquitto_passwd` can maintain it):
//
//	site-a:$7$210000$<salt, standard base64>$<hash, standard base64>
//
// $7$ is PBKDF2-HMAC-SHA512 with the given iteration count, a 12- or 64-byte
// salt and a 64-byte derived key. Blank lines and lines starting with '#'
// are ignored. Usernames must be valid edgefl ids ([A-Za-z0-9._-], 1 to 64
// characters): a username is the client's identity, its MQTT client id and
// the <id> in its topics. Mosquitto's legacy $6$ (one salted SHA-512) and
// plain-text entries are refused.

// DefaultIterations is the PBKDF2-HMAC-SHA512 iteration count HashPassword
// uses when given 0 (OWASP's 2023 figure for PBKDF2-SHA512). Verifying costs
// about 0.1 s on a Raspberry Pi 4, once per connection.
const DefaultIterations = 210_000

// MaxIterations bounds the iteration count accepted from a file, so that a
// mistyped entry cannot make every connection attempt take minutes.
const MaxIterations = 10_000_000

const (
	saltLen = 12 // Mosquitto 2.0 accepts 12 only; later versions 12 or 64
	hashLen = 64
)

// ErrPasswordFile reports an unusable password file entry.
var ErrPasswordFile = errors.New("broker: bad password file")

// HashPassword returns the Mosquitto "$7$" PBKDF2-HMAC-SHA512 encoding of
// password with a random salt; iterations <= 0 means DefaultIterations.
func HashPassword(password string, iterations int) (string, error) {
	if iterations <= 0 {
		iterations = DefaultIterations
	}
	if iterations > MaxIterations {
		return "", fmt.Errorf("broker: %d iterations, at most %d", iterations, MaxIterations)
	}
	salt := make([]byte, saltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("broker: salt: %w", err)
	}
	dk, err := pbkdf2.Key(sha512.New, password, salt, iterations, hashLen)
	if err != nil {
		return "", fmt.Errorf("broker: pbkdf2: %w", err)
	}
	return fmt.Sprintf("$7$%d$%s$%s", iterations, base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(dk)), nil
}

// passwordHash is a parsed "$7$" entry.
type passwordHash struct {
	iterations int
	salt, dk   []byte
}

func parseHash(s string) (passwordHash, error) {
	rest, ok := strings.CutPrefix(s, "$7$")
	if !ok {
		if strings.HasPrefix(s, "$6$") {
			return passwordHash{}, errors.New("legacy $6$ (single salted SHA-512) hash: re-hash with `broker-agg pki passwd` or mosquitto_passwd >= 2.0")
		}
		return passwordHash{}, errors.New(`not a "$7$" PBKDF2-SHA512 hash (plain-text passwords are refused)`)
	}
	parts := strings.Split(rest, "$")
	if len(parts) != 3 {
		return passwordHash{}, errors.New(`want "$7$ITERATIONS$SALT$HASH"`)
	}
	it, err := strconv.Atoi(parts[0])
	if err != nil || it < 1 || it > MaxIterations {
		return passwordHash{}, fmt.Errorf("iteration count %q: want 1..%d", parts[0], MaxIterations)
	}
	salt, err := base64.StdEncoding.DecodeString(parts[1])
	if err != nil || (len(salt) != 12 && len(salt) != 64) {
		return passwordHash{}, errors.New("salt: want 12 or 64 bytes of standard base64")
	}
	dk, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(dk) != hashLen {
		return passwordHash{}, fmt.Errorf("hash: want %d bytes of standard base64", hashLen)
	}
	return passwordHash{iterations: it, salt: salt, dk: dk}, nil
}

func (h passwordHash) verify(password string) bool {
	dk, err := pbkdf2.Key(sha512.New, password, h.salt, h.iterations, hashLen)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(dk, h.dk) == 1
}

// VerifyPassword reports whether password matches a "$7$" hash.
func VerifyPassword(hash, password string) (bool, error) {
	h, err := parseHash(hash)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrPasswordFile, err)
	}
	return h.verify(password), nil
}

// maxPasswordFile bounds the size of a password file read into memory.
const maxPasswordFile = 16 << 20

// ReadPasswordFile parses a password file (see the format above) into
// username -> hash. Any bad line is an error naming the file and line.
func ReadPasswordFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("broker: password file: %w", err)
	}
	defer f.Close()
	users, err := parsePasswordFile(io.LimitReader(f, maxPasswordFile+1), path)
	if err != nil {
		return nil, err
	}
	return users, nil
}

func parsePasswordFile(r io.Reader, name string) (map[string]string, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("broker: password file %s: %w", name, err)
	}
	if len(data) > maxPasswordFile {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrPasswordFile, name, maxPasswordFile)
	}
	users := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxPasswordFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("%w: %s:%d: want username:hash", ErrPasswordFile, name, n)
		}
		if err := wire.ValidID(user); err != nil {
			return nil, fmt.Errorf("%w: %s:%d: username: %w", ErrPasswordFile, name, n, err)
		}
		if _, err := parseHash(hash); err != nil {
			return nil, fmt.Errorf("%w: %s:%d (%s): %w", ErrPasswordFile, name, n, user, err)
		}
		if _, dup := users[user]; dup {
			return nil, fmt.Errorf("%w: %s:%d: user %q listed twice", ErrPasswordFile, name, n, user)
		}
		users[user] = hash
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("broker: password file %s: %w", name, err)
	}
	return users, nil
}

// SetPassword adds or replaces user's entry in the password file at path
// (created with mode 0600 if missing), keeping the other lines as they are.
// The file is rewritten through a temporary file and a rename that keep an
// existing file's owner, group and mode (Mosquitto reads it as its own
// user: a file left owned by root and readable by root only makes its next
// reload refuse every client), and through a symbolic link to its target.
// When the owner cannot be kept (not run as root or as the owner) nothing
// is written and the error says so.
func SetPassword(path, user, password string, iterations int) error {
	if err := wire.ValidID(user); err != nil {
		return fmt.Errorf("broker: username: %w", err)
	}
	if password == "" {
		return errors.New("broker: empty password")
	}
	hash, err := HashPassword(password, iterations)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real // rename onto the target, not over the link
	}
	mode := os.FileMode(0o600)
	owner := fileOwner{}
	if fi, err := os.Stat(path); err == nil {
		mode, owner = fi.Mode().Perm(), ownerOf(fi)
	}
	var lines []string
	old, err := os.ReadFile(path)
	switch {
	case err == nil:
		if _, err := parsePasswordFile(bytes.NewReader(old), path); err != nil {
			return err
		}
		lines = strings.Split(strings.TrimRight(string(old), "\n"), "\n")
		if len(old) == 0 {
			lines = nil
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("broker: password file: %w", err)
	}
	entry := user + ":" + hash
	replaced := false
	for i, l := range lines {
		if u, _, ok := strings.Cut(l, ":"); ok && u == user && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines[i], replaced = entry, true
		}
	}
	if !replaced {
		lines = append(lines, entry)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("broker: password file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := owner.apply(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("broker: password file %s: cannot keep its owner %s (run as root or as its owner): %w", path, owner, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("broker: password file: %w", err)
	}
	if _, err := tmp.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("broker: password file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("broker: password file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("broker: password file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("broker: password file: %w", err)
	}
	return nil
}
