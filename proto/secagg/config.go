package secagg

import (
	"errors"
	"fmt"
)

// Config is what every party of one secure-aggregation session agrees on
// before it starts (the round announcement carries it).
type Config struct {
	// Threshold t: any t holders reconstruct a secret, t-1 learn nothing.
	// At least 2, and more than half of a secret's holders (see checkSites).
	Threshold int
	// Degree is the neighbour count of SecAgg+'s sparse graph (even, >= 2);
	// 0 means every site masks with every other (Bonawitz et al.).
	Degree int
	// GraphSeed is the public seed of the sparse graph; unused when Degree
	// is 0.
	GraphSeed [KeySize]byte
	// Dim is the length of every input vector.
	Dim int
}

// MaxSites bounds the sites of one session (and so what a key list makes a
// party allocate).
const MaxSites = 1 << 14

// MaxDim bounds Config.Dim.
const MaxDim = 1 << 26

// Sentinel errors; the state machines wrap them with detail.
var (
	// ErrTooFewSites: fewer than Threshold sites remain; the round aborts.
	ErrTooFewSites = errors.New("secagg: fewer sites than the threshold remain")
	// ErrAborted: the session aborted earlier and takes no more steps.
	ErrAborted = errors.New("secagg: session aborted")
	// ErrPrivacy: the request would make a site reveal both kinds of share
	// for one site.
	ErrPrivacy = errors.New("secagg: refused: would reveal both the self-mask and the mask-key share of one site")
	// ErrConflict: a second, different message where one was already taken.
	ErrConflict = errors.New("secagg: conflicting message")
	// ErrPhase: a message for another phase than the current one.
	ErrPhase = errors.New("secagg: message for another phase")
	// ErrTampered: a share or box fails its check (AEAD, or a reconstructed
	// secret that does not match its advertised key or commitment).
	ErrTampered = errors.New("secagg: tampered or inconsistent share")
)

// DefaultThreshold returns ceil(2n/3), at least 2: a secret survives n/3
// dropouts, and more than half of the n holders are needed, so a server
// cannot collect both kinds of share of one site from honest sites.
func DefaultThreshold(n int) int {
	return max(2, (2*n+2)/3)
}

// Validate checks the fields on their own.
func (c Config) Validate() error {
	switch {
	case c.Threshold < 2:
		return fmt.Errorf("secagg: threshold %d must be at least 2", c.Threshold)
	case c.Degree < 0 || c.Degree%2 != 0:
		return fmt.Errorf("secagg: degree %d must be 0 (complete graph) or even", c.Degree)
	case c.Degree != 0 && c.Threshold > c.Degree+1:
		return fmt.Errorf("secagg: threshold %d above the %d holders of a degree-%d graph", c.Threshold, c.Degree+1, c.Degree)
	case c.Dim < 1 || c.Dim > MaxDim:
		return fmt.Errorf("secagg: dimension %d not in 1..%d", c.Dim, MaxDim)
	}
	return nil
}

// holders is how many sites hold shares of one site's secrets (itself
// included) when n sites advertised keys.
func (c Config) holders(n int) int {
	if c.Degree == 0 || c.Degree >= n-1 {
		return n
	}
	return c.Degree + 1
}

// checkSites checks the threshold against the n sites that advertised keys:
// at least t of them, and t more than half of each secret's holders. The
// second rule is what makes the client-side privacy rule sufficient: an
// honest site reveals one kind of share per site, so the sets revealing each
// kind are disjoint and only one of them can reach t.
func (c Config) checkSites(n int) error {
	if n < c.Threshold {
		return fmt.Errorf("%w: %d sites advertised keys, threshold %d", ErrTooFewSites, n, c.Threshold)
	}
	if h := c.holders(n); 2*c.Threshold <= h {
		return fmt.Errorf("secagg: threshold %d is not above half of the %d holders of each secret", c.Threshold, h)
	}
	return nil
}
