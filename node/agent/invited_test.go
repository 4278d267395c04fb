package agent

import (
	"context"
	"testing"
)

// TestHandleInvited: an announcement with a private selection lists nobody
// and selects nobody (an empty list does not mean every site then); the
// same announcement handled as invited is solved, after the not-selected
// handling recorded it as seen; an invitation does not select a site that
// a public announcement leaves out.
func TestHandleInvited(t *testing.T) {
	h, _ := newHandler(t)
	ann := announce(t, 5, AlgoFedProx, f32(testGlobal(5)))
	ann.Selected, ann.PrivateSelection = nil, true
	if Selected(ann, testSite) {
		t.Fatal("a private announcement selects the site by itself")
	}
	res, err := h.Handle(context.Background(), ann)
	if err != nil || res.Action != ActionNotSelected {
		t.Fatal(res.Action, err)
	}
	if st := snapshot(t, h.Store); st.seen != 5 || st.applied != 0 || st.global != nil {
		t.Fatalf("not invited: state %+v", st)
	}
	if res, err := h.HandleInvited(context.Background(), ann, true); err != nil || res.Action != ActionSolved {
		t.Fatal("invited:", res.Action, err)
	}
	if res, err := h.HandleInvited(context.Background(), ann, true); err != nil || res.Action != ActionResend {
		t.Fatal("invited again:", res.Action, err)
	}

	pub := announce(t, 6, AlgoFedProx, f32(testGlobal(5)))
	pub.Selected = []string{"site-b"}
	if res, err := h.HandleInvited(context.Background(), pub, true); err != nil || res.Action != ActionNotSelected {
		t.Fatal("invited to a public round that leaves the site out:", res.Action, err)
	}
}
