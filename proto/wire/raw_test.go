package wire

import (
	"math"
	"testing"
)

// rawMsg is any message type, marshalled without Encode's validation.
type rawMsg = codec

func rawMarshal(t testing.TB, m rawMsg) []byte {
	t.Helper()
	return marshal(m)
}

// rawUnmarshal decodes b into m without limits or validation, as
// proto.Unmarshal would.
func rawUnmarshal(b []byte, m rawMsg) error {
	d := decoder{lim: noLimits, maxHidden: math.MaxInt, maxCapabilities: math.MaxInt}
	return m.unmarshal(b, &d)
}
