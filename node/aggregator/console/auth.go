package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Open reports the paths served without authentication: /healthz (it says
// "ok" or why not, nothing else), for probes.
func Open(path string) bool { return path == "/healthz" }

// BasicAuth requires HTTP basic auth on every request but Open ones; check
// verifies a username and password (a Mosquitto-format password file's
// PBKDF2 hash: deliberately slow). A successful login is remembered for
// authCacheTTL as a keyed hash of the username and password, so that a
// console polling every second costs one verification, not one a poll;
// verifications run one at a time, so wrong guesses cost at most one core.
// now is the clock the cache's expiry reads (the daemon's clock.Clock Now).
func BasicAuth(next http.Handler, check func(user, password string) bool, now func() time.Time) http.Handler {
	a := &basicAuth{next: next, check: check, now: now, ok: map[[32]byte]time.Time{}, sem: make(chan struct{}, 1)}
	if _, err := rand.Read(a.key[:]); err != nil {
		panic(fmt.Sprintf("console: random key: %v", err))
	}
	return a
}

const (
	authCacheTTL = 10 * time.Minute
	authCacheMax = 1024
)

type basicAuth struct {
	next  http.Handler
	check func(user, password string) bool
	now   func() time.Time
	key   [32]byte
	sem   chan struct{}

	mu sync.Mutex
	ok map[[32]byte]time.Time // keyed hash of user and password -> until
}

func (a *basicAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if Open(r.URL.Path) {
		a.next.ServeHTTP(w, r)
		return
	}
	user, pw, has := r.BasicAuth()
	if has && a.verify(r, user, pw) {
		a.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="edgefl console", charset="UTF-8"`)
	http.Error(w, "authentication required", http.StatusUnauthorized)
}

func (a *basicAuth) verify(r *http.Request, user, pw string) bool {
	m := hmac.New(sha256.New, a.key[:])
	m.Write([]byte(user))
	m.Write([]byte{0})
	m.Write([]byte(pw))
	var k [32]byte
	copy(k[:], m.Sum(nil))
	now := a.now()
	a.mu.Lock()
	until, cached := a.ok[k]
	a.mu.Unlock()
	if cached && now.Before(until) {
		return true
	}
	select {
	case a.sem <- struct{}{}:
	case <-r.Context().Done():
		return false
	}
	good := a.check(user, pw)
	<-a.sem
	if !good {
		return false
	}
	a.mu.Lock()
	if len(a.ok) >= authCacheMax {
		clear(a.ok)
	}
	a.ok[k] = now.Add(authCacheTTL)
	a.mu.Unlock()
	return true
}

// ClientNames lets in only requests whose verified client certificate's
// common name is one of names (the TLS layer has checked it was issued by
// the federation's CA; a site's certificate is from that CA too, and must
// not open the operator's console).
func ClientNames(next http.Handler, names []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := ""
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			cn = r.TLS.VerifiedChains[0][0].Subject.CommonName
		}
		if cn == "" || !slices.Contains(names, cn) {
			http.Error(w, fmt.Sprintf("client certificate %q is not allowed here (allowed: %v)", cn, names), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
