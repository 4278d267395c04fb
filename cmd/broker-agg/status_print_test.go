package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/aggregator"
)

// `status` lists a site used by a second installation, with the holder and
// the installation set aside.
func TestPrintStatusDuplicateInstances(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseCollecting, Round: 3,
		DuplicateInstances: []aggregator.DuplicateInstance{{Site: "site-a", Instance: "INSTA",
			Others: []aggregator.OtherInstance{{ID: "INSTB", LastSeen: at}}, SetAside: 7}}}
	var b bytes.Buffer
	if err := printStatus(&b, st, at); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"second installations with one site id",
		"site-a: held by instance INSTA; set aside: INSTB (last seen 2026-03-01T12:00:00Z), 7 messages"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, b.String())
		}
	}
}
