package wire

import "testing"

// TestValidatePrivateSelection: an announcement with private_selection
// lists nobody in selected (the one field whose empty value does not mean
// "every client"); an invitation names a round, is not an acceptance, and
// only it carries a run id.
func TestValidatePrivateSelection(t *testing.T) {
	anns := []struct {
		name   string
		mutate func(*RoundAnnouncement)
		ok     bool
	}{
		{"private, nobody listed", func(r *RoundAnnouncement) { r.Selected, r.PrivateSelection = nil, true }, true},
		{"private with a list", func(r *RoundAnnouncement) { r.Selected, r.PrivateSelection = []string{"a"}, true }, false},
		{"public with a list", func(r *RoundAnnouncement) { r.Selected = []string{"a"} }, true},
	}
	for _, tt := range anns {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRound()
			tt.mutate(r)
			checkValidity(t, r, tt.ok, Limits{})
		})
	}
	inv := func(mutate func(*Receipt)) *Receipt {
		r := &Receipt{ClientId: "a", Round: 3, Subject: ReceiptSubject_RECEIPT_SUBJECT_INVITATION, RunId: "R1"}
		mutate(r)
		return r
	}
	receipts := []struct {
		name string
		r    *Receipt
		ok   bool
	}{
		{"invitation", inv(func(*Receipt) {}), true},
		{"invitation of an unnamed run", inv(func(r *Receipt) { r.RunId = "" }), true},
		{"invitation round 0", inv(func(r *Receipt) { r.Round = 0 }), false},
		{"invitation accepted", inv(func(r *Receipt) { r.Accepted, r.StoredAtUnixMs, r.Code = true, 1, ReceiptCode_RECEIPT_CODE_STORED }), false},
		{"invitation run id too long", inv(func(r *Receipt) { r.RunId = string(make([]byte, maxRunIDLen+1)) }), false},
		{"run id on an update receipt", &Receipt{ClientId: "a", Round: 3, RunId: "R1"}, false},
	}
	for _, tt := range receipts {
		t.Run(tt.name, func(t *testing.T) { checkValidity(t, tt.r, tt.ok, Limits{}) })
	}
}
