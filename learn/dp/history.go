package dp

import (
	"fmt"
	"slices"
)

// Rate is a run of consecutive rounds charged with one sampling rate Q and
// noise multiplier Noise. A run's rates, oldest first, are its charging
// history: Replay recomputes from them the accountant of any prefix of the
// run (the epsilon of the model after round e, which a model bundle
// records), and a bundle lists them as the sampling rates it was charged
// at. A run whose selection size and pool stay fixed has one Rate.
type Rate struct {
	Q      float64 `json:"q"`
	Noise  float64 `json:"noise_multiplier"`
	Rounds uint64  `json:"rounds"`
}

// AppendRate records one more round charged at (q, z): the last run grows
// when it has the same rate, else a new run starts. rs is not modified.
func AppendRate(rs []Rate, q, z float64) []Rate {
	out := slices.Clone(rs)
	if n := len(out); n > 0 && out[n-1].Q == q && out[n-1].Noise == z {
		out[n-1].Rounds++
		return out
	}
	return append(out, Rate{Q: q, Noise: z, Rounds: 1})
}

// RatesRounds is the number of rounds rs records.
func RatesRounds(rs []Rate) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.Rounds
	}
	return n
}

// RatesPrefix is the history of the first rounds rounds of rs (an error
// when rs records fewer).
func RatesPrefix(rs []Rate, rounds uint64) ([]Rate, error) {
	var out []Rate
	left := rounds
	for _, r := range rs {
		if left == 0 {
			break
		}
		take := min(r.Rounds, left)
		out = append(out, Rate{Q: r.Q, Noise: r.Noise, Rounds: take})
		left -= take
	}
	if left > 0 {
		return nil, fmt.Errorf("dp: the charging history records %d rounds, not %d", rounds-left, rounds)
	}
	return out, nil
}

// Replay is the accountant (over orders; nil: DefaultOrders) after the
// first rounds rounds of the history rs, charged one Step per round in
// order, so that its RDP values are bit for bit those of the accountant
// that charged them as the rounds closed.
func Replay(rs []Rate, rounds uint64, orders []float64) (*Accountant, error) {
	pre, err := RatesPrefix(rs, rounds)
	if err != nil {
		return nil, err
	}
	a := NewAccountant(orders)
	for _, r := range pre {
		for range r.Rounds {
			if err := a.Step(r.Q, r.Noise); err != nil {
				return nil, err
			}
		}
	}
	return a, nil
}
