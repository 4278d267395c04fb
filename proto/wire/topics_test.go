package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestValidID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"site-01", true},
		{"St.Mary_ICU.3", true},
		{strings.Repeat("a", MaxIDLen), true},
		{"", false},
		{strings.Repeat("a", MaxIDLen+1), false},
		{"a/b", false},
		{"a+", false},
		{"#", false},
		{"a b", false},
		{"é", false},
		{"a\x00", false},
		{"$SYS", false},
	}
	for _, tt := range tests {
		err := ValidID(tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("ValidID(%q) = %v, want ok=%v", tt.id, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrBadID) {
			t.Errorf("ValidID(%q) = %v, want ErrBadID", tt.id, err)
		}
	}
}

func TestNewTopicsPrefix(t *testing.T) {
	tests := []struct {
		prefix string
		ok     bool
	}{
		{"edgefl/fed1/", true},
		{"hospital/a/edgefl/", true},
		{"x/", true},
		{"", false},
		{"edgefl/fed1", false},
		{"edgefl/+/", false},
		{"edgefl/#/", false},
		{"$SYS/edgefl/", false},
		{"/edgefl/", false},
		{"edgefl//x/", false},
		{"edge\x00fl/", false},
		{"edge\xfffl/", false},
	}
	for _, tt := range tests {
		_, err := NewTopics(tt.prefix)
		if (err == nil) != tt.ok {
			t.Errorf("NewTopics(%q) = %v, want ok=%v", tt.prefix, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrBadPrefix) {
			t.Errorf("NewTopics(%q) = %v, want ErrBadPrefix", tt.prefix, err)
		}
	}
	if _, err := ForFederation("bad/fed"); !errors.Is(err, ErrBadID) {
		t.Errorf("ForFederation(bad/fed) = %v, want ErrBadID", err)
	}
}

func TestTopicsBuildAndParse(t *testing.T) {
	tp, err := ForFederation("fed1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tp.Prefix(), "edgefl/fed1/"; got != want {
		t.Fatalf("Prefix = %q, want %q", got, want)
	}
	mustTopic := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		topic string
		want  string
		kind  Kind
		id    string
	}{
		{tp.Round(), "edgefl/fed1/round", KindRound, ""},
		{mustTopic(tp.Status("site-1")), "edgefl/fed1/clients/site-1/status", KindStatus, "site-1"},
		{mustTopic(tp.Update("site-1")), "edgefl/fed1/updates/site-1", KindUpdate, "site-1"},
		{mustTopic(tp.Receipt("a.b_c")), "edgefl/fed1/receipts/a.b_c", KindReceipt, "a.b_c"},
	}
	for _, tt := range tests {
		if tt.topic != tt.want {
			t.Errorf("built %q, want %q", tt.topic, tt.want)
		}
		kind, id, err := tp.Parse(tt.topic)
		if err != nil || kind != tt.kind || id != tt.id {
			t.Errorf("Parse(%q) = %v, %q, %v; want %v, %q", tt.topic, kind, id, err, tt.kind, tt.id)
		}
	}
	if got := tp.StatusFilter(); got != "edgefl/fed1/clients/+/status" {
		t.Errorf("StatusFilter = %q", got)
	}
	if got := tp.UpdateFilter(); got != "edgefl/fed1/updates/+" {
		t.Errorf("UpdateFilter = %q", got)
	}
	for _, id := range []string{"", "a/b", "+", "#", strings.Repeat("x", 65)} {
		if _, err := tp.Update(id); !errors.Is(err, ErrBadID) {
			t.Errorf("Update(%q) = %v, want ErrBadID", id, err)
		}
		if _, err := tp.Status(id); !errors.Is(err, ErrBadID) {
			t.Errorf("Status(%q) = %v, want ErrBadID", id, err)
		}
	}
	var zero Topics
	if _, err := zero.Update("a"); !errors.Is(err, ErrBadPrefix) {
		t.Errorf("zero Topics Update = %v, want ErrBadPrefix", err)
	}
	if _, _, err := zero.Parse("edgefl/fed1/round"); !errors.Is(err, ErrBadPrefix) {
		t.Errorf("zero Topics Parse = %v, want ErrBadPrefix", err)
	}
}

func TestParseRejects(t *testing.T) {
	tp, err := NewTopics("edgefl/fed1/")
	if err != nil {
		t.Fatal(err)
	}
	bad := []string{
		"",
		"edgefl/fed2/round",
		"edgefl/fed1/",
		"edgefl/fed1/round/x",
		"edgefl/fed1/rounds",
		"edgefl/fed1/updates/",
		"edgefl/fed1/updates/a/b",
		"edgefl/fed1/updates/+",
		"edgefl/fed1/updates/#",
		"edgefl/fed1/receipts/",
		"edgefl/fed1/clients/status",
		"edgefl/fed1/clients//status",
		"edgefl/fed1/clients/a/b/status",
		"edgefl/fed1/clients/a/state",
		"edgefl/fed1/clients/a",
		"edgefl/fed1/other/a",
		"edgefl/fed1/updates/" + strings.Repeat("x", 65),
		"edgefl/fed1/updates/" + strings.Repeat("x", 70000),
	}
	for _, topic := range bad {
		kind, id, err := tp.Parse(topic)
		if err == nil {
			t.Errorf("Parse(%.80q) = %v, %q, nil; want an error", topic, kind, id)
			continue
		}
		if !errors.Is(err, ErrBadTopic) {
			t.Errorf("Parse(%.80q) = %v, want ErrBadTopic", topic, err)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	tp, err := ForFederation("fed1")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"edgefl/fed1/round", "edgefl/fed1/clients/a/status", "edgefl/fed1/updates/x", "edgefl/fed1/receipts/y", "edgefl/fed1/clients//status"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		kind, id, err := tp.Parse(topic)
		if err != nil {
			return
		}
		// Whatever parses must rebuild to the same topic.
		var back string
		switch kind {
		case KindRound:
			back = tp.Round()
		case KindStatus:
			back, err = tp.Status(id)
		case KindUpdate:
			back, err = tp.Update(id)
		case KindReceipt:
			back, err = tp.Receipt(id)
		default:
			t.Fatalf("Parse(%q) returned kind %v without error", topic, kind)
		}
		if err != nil || back != topic {
			t.Fatalf("Parse(%q) = %v %q, rebuilds to %q, %v", topic, kind, id, back, err)
		}
	})
}

func TestTopicsDecode(t *testing.T) {
	tp, err := ForFederation("fed1")
	if err != nil {
		t.Fatal(err)
	}
	update := mustEncode(t, sampleUpdate()) // client site-1
	tests := []struct {
		name  string
		topic string
		msg   []byte
		kind  Kind
		want  error
	}{
		{"update", "edgefl/fed1/updates/site-1", update, KindUpdate, nil},
		{"round", "edgefl/fed1/round", mustEncode(t, sampleRound()), KindRound, nil},
		{"status", "edgefl/fed1/clients/site-1/status", mustEncode(t, sampleStatus()), KindStatus, nil},
		{"receipt", "edgefl/fed1/receipts/site-1", mustEncode(t, sampleReceipt()), KindReceipt, nil},
		{"update as another client", "edgefl/fed1/updates/site-2", update, KindUpdate, ErrTopicMismatch},
		{"status as another client", "edgefl/fed1/clients/site-2/status", mustEncode(t, sampleStatus()), KindStatus, ErrTopicMismatch},
		{"status on the update topic", "edgefl/fed1/updates/site-1", mustEncode(t, sampleStatus()), KindUpdate, ErrWrongType},
		{"update on the round topic", "edgefl/fed1/round", update, KindRound, ErrWrongType},
		{"bad topic", "edgefl/fed1/updates/+", update, KindUnknown, ErrBadTopic},
		{"garbage", "edgefl/fed1/updates/site-1", []byte{0xff}, KindUpdate, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, m, err := tp.Decode(tt.topic, tt.msg, Limits{})
			if kind != tt.kind {
				t.Errorf("kind = %v, want %v", kind, tt.kind)
			}
			if tt.want == nil {
				if err != nil || m == nil {
					t.Fatalf("Decode = %v, %v", m, err)
				}
				return
			}
			if !errors.Is(err, tt.want) || m != nil {
				t.Fatalf("Decode = %v, %v; want nil, %v", m, err, tt.want)
			}
		})
	}
}
