package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The aggregator stores its SumState with each round's checkpoint
// (aggstore.Round.Sum), in this binary form (little-endian floats):
//
//	"EFS1" | m u64 | members u32 | per member, in id order:
//	  len u8 | id | len u8 | instance | joined u64
//	| dim u32 | dim float64s
//
// UnmarshalBinary refuses anything else: a short or long value, members
// out of order or more than m, a sum without members or members without a
// sum, a non-finite value.
//
// A fixed roster (SumState.Fixed) is "EFS2" | flags u8 (1: fixed) and the
// same fields, with exactly m members once m > 0; a state that counts sites
// on their first update is still written as "EFS1", so what versions that
// know only "EFS1" stored reads back unchanged (as Fixed false).

var (
	sumMagic      = []byte("EFS1")
	sumMagicFixed = []byte("EFS2")
)

// errSumState is wrapped by every UnmarshalBinary error.
var errSumState = errors.New("uplink: bad sum state")

// MarshalBinary encodes st.
func (st *SumState) MarshalBinary() ([]byte, error) {
	ids := make([]string, 0, len(st.Members))
	for id := range st.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if uint64(len(ids)) > st.M || (st.M == 0) != (len(st.S) == 0) {
		return nil, fmt.Errorf("uplink: sum state of %d members, m = %d, %d values", len(ids), st.M, len(st.S))
	}
	if st.Fixed && st.M > 0 && uint64(len(ids)) != st.M {
		return nil, fmt.Errorf("uplink: a fixed roster of %d members, m = %d", len(ids), st.M)
	}
	b := append([]byte(nil), sumMagic...)
	if st.Fixed {
		b = append(append(b[:0], sumMagicFixed...), 1)
	}
	b = binary.BigEndian.AppendUint64(b, st.M)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		m := st.Members[id]
		if id == "" || len(id) > math.MaxUint8 || len(m.Instance) > math.MaxUint8 {
			return nil, fmt.Errorf("uplink: sum state member %q (instance %q): an id of 1..255 bytes", id, m.Instance)
		}
		b = append(b, byte(len(id)))
		b = append(b, id...)
		b = append(b, byte(len(m.Instance)))
		b = append(b, m.Instance...)
		b = binary.BigEndian.AppendUint64(b, m.Joined)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(st.S)))
	for _, v := range st.S {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary wrote into st.
func (st *SumState) UnmarshalBinary(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errSumState, fmt.Sprintf(format, args...))
	}
	fixed := false
	switch {
	case len(b) >= len(sumMagicFixed)+1 && string(b[:len(sumMagicFixed)]) == string(sumMagicFixed):
		if b[len(sumMagicFixed)] != 1 {
			return bad("flags %#x", b[len(sumMagicFixed)])
		}
		fixed, b = true, b[len(sumMagicFixed)+1:]
	case len(b) >= len(sumMagic) && string(b[:len(sumMagic)]) == string(sumMagic):
		b = b[len(sumMagic):]
	default:
		return bad("no header")
	}
	if len(b) < 8+4 {
		return bad("no header")
	}
	m := binary.BigEndian.Uint64(b)
	n := binary.BigEndian.Uint32(b[8:])
	b = b[12:]
	if uint64(n) > m || uint64(n) > uint64(len(b))/10 {
		return bad("%d members, m = %d", n, m)
	}
	members := make(map[string]Member, n)
	prev := ""
	str := func() (string, bool) {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return "", false
		}
		s := string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
		return s, true
	}
	for i := range n {
		id, ok := str()
		if !ok || id == "" || (i > 0 && strings.Compare(id, prev) <= 0) {
			return bad("member %d: id missing, empty or out of order", i)
		}
		inst, ok := str()
		if !ok || len(b) < 8 {
			return bad("member %q truncated", id)
		}
		members[id] = Member{Instance: inst, Joined: binary.BigEndian.Uint64(b)}
		b, prev = b[8:], id
	}
	if len(b) < 4 {
		return bad("no dimension")
	}
	dim := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(len(b)) != 8*uint64(dim) || (m == 0) != (dim == 0) {
		return bad("%d bytes for %d values (m = %d)", len(b), dim, m)
	}
	var s []float64
	if dim > 0 {
		s = make([]float64, dim)
		for i := range s {
			s[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			if math.IsNaN(s[i]) || math.IsInf(s[i], 0) {
				return bad("S[%d] is %v", i, s[i])
			}
		}
	}
	if fixed && m > 0 && uint64(n) != m {
		return bad("a fixed roster of %d members, m = %d", n, m)
	}
	*st = SumState{Fixed: fixed, S: s, M: m, Members: members}
	return nil
}
