package wire

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Kind is what a topic carries.
type Kind int

// Topic kinds.
const (
	KindUnknown Kind = iota
	KindRound        // <prefix>round, retained
	KindStatus       // <prefix>clients/<id>/status, retained; last will = offline
	KindUpdate       // <prefix>updates/<id>: ClientUpdate, SiteStatistics or EvalReport
	KindReceipt      // <prefix>receipts/<id>
	KindRun          // <prefix>run, retained: the run's RunSpec
)

func (k Kind) String() string {
	switch k {
	case KindRound:
		return "round"
	case KindStatus:
		return "status"
	case KindUpdate:
		return "update"
	case KindReceipt:
		return "receipt"
	case KindRun:
		return "run"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// MaxIDLen is the longest client or federation id.
const MaxIDLen = 64

// maxTopicLen is MQTT's limit on a topic name (a UTF-8 string with a 16-bit
// length prefix).
const maxTopicLen = 65535

// Topic errors.
var (
	ErrBadID     = errors.New("wire: invalid id")
	ErrBadPrefix = errors.New("wire: invalid topic prefix")
	ErrBadTopic  = errors.New("wire: topic is not an edgefl topic")
)

// ValidID reports whether id is a usable client or federation id: 1 to 64
// characters from [A-Za-z0-9._-]. The charset excludes MQTT's wildcards and
// level separator, so an id is always exactly one topic level.
func ValidID(id string) error {
	if len(id) == 0 {
		return fmt.Errorf("%w: empty", ErrBadID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadID, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) {
			return fmt.Errorf("%w: %q: byte %d (%q) is not in [A-Za-z0-9._-]", ErrBadID, id, i, id[i])
		}
	}
	return nil
}

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// DefaultPrefix returns the default topic prefix of a federation,
// "edgefl/<federation>/".
func DefaultPrefix(federation string) (string, error) {
	if err := ValidID(federation); err != nil {
		return "", fmt.Errorf("federation: %w", err)
	}
	return "edgefl/" + federation + "/", nil
}

// Topics builds and parses a federation's topic names under one prefix.
// The zero value is not usable; use NewTopics or ForFederation.
type Topics struct {
	prefix string
}

// NewTopics returns the topics under prefix. The prefix must be non-empty
// valid UTF-8, end with '/', contain no MQTT wildcard ('+', '#'), no NUL and
// no empty level, and must not start with '$' (reserved for the broker).
func NewTopics(prefix string) (Topics, error) {
	switch {
	case prefix == "":
		return Topics{}, fmt.Errorf("%w: empty", ErrBadPrefix)
	case len(prefix) > 1024:
		return Topics{}, fmt.Errorf("%w: %d bytes, at most 1024", ErrBadPrefix, len(prefix))
	case !utf8.ValidString(prefix):
		return Topics{}, fmt.Errorf("%w: not valid UTF-8", ErrBadPrefix)
	case !strings.HasSuffix(prefix, "/"):
		return Topics{}, fmt.Errorf("%w: %q must end with '/'", ErrBadPrefix, prefix)
	case strings.HasPrefix(prefix, "$"):
		return Topics{}, fmt.Errorf("%w: %q starts with '$' (reserved for the broker)", ErrBadPrefix, prefix)
	case strings.ContainsAny(prefix, "+#\x00"):
		return Topics{}, fmt.Errorf("%w: %q contains a wildcard or NUL", ErrBadPrefix, prefix)
	case strings.HasPrefix(prefix, "/") || strings.Contains(prefix, "//"):
		return Topics{}, fmt.Errorf("%w: %q has an empty topic level", ErrBadPrefix, prefix)
	}
	return Topics{prefix: prefix}, nil
}

// ForFederation returns the topics under DefaultPrefix(federation).
func ForFederation(federation string) (Topics, error) {
	p, err := DefaultPrefix(federation)
	if err != nil {
		return Topics{}, err
	}
	return NewTopics(p)
}

// Prefix returns the prefix, ending in '/'.
func (t Topics) Prefix() string { return t.prefix }

// Round is the retained round-announcement topic.
func (t Topics) Round() string { return t.prefix + "round" }

// Run is the retained topic of the run's RunSpec (the schema and transform
// the announcements name by digest).
func (t Topics) Run() string { return t.prefix + "run" }

// Status is client id's retained status topic (also its last-will topic).
func (t Topics) Status(id string) (string, error) { return t.client("clients/", id, "/status") }

// Update is the topic client id publishes its updates on.
func (t Topics) Update(id string) (string, error) { return t.client("updates/", id, "") }

// Receipt is the topic the aggregator publishes client id's receipts on.
func (t Topics) Receipt(id string) (string, error) { return t.client("receipts/", id, "") }

// StatusFilter is the subscription filter matching every client's status.
func (t Topics) StatusFilter() string { return t.prefix + "clients/+/status" }

// UpdateFilter is the subscription filter matching every client's updates.
func (t Topics) UpdateFilter() string { return t.prefix + "updates/+" }

func (t Topics) client(head, id, tail string) (string, error) {
	if t.prefix == "" {
		return "", fmt.Errorf("%w: zero Topics value", ErrBadPrefix)
	}
	if err := ValidID(id); err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	return t.prefix + head + id + tail, nil
}

// Parse splits a topic under t's prefix into its kind and client id (empty
// for KindRound). Anything else — another prefix, an unknown level, an
// invalid id, a wildcard — is an error wrapping ErrBadTopic or ErrBadID.
func (t Topics) Parse(topic string) (Kind, string, error) {
	if t.prefix == "" {
		return KindUnknown, "", fmt.Errorf("%w: zero Topics value", ErrBadPrefix)
	}
	if len(topic) > maxTopicLen {
		return KindUnknown, "", fmt.Errorf("%w: %d bytes", ErrBadTopic, len(topic))
	}
	rest, ok := strings.CutPrefix(topic, t.prefix)
	if !ok {
		return KindUnknown, "", fmt.Errorf("%w: %q is not under %q", ErrBadTopic, topic, t.prefix)
	}
	switch rest {
	case "round":
		return KindRound, "", nil
	case "run":
		return KindRun, "", nil
	}
	var kind Kind
	var id string
	switch {
	case strings.HasPrefix(rest, "clients/") && strings.HasSuffix(rest, "/status") && len(rest) >= len("clients//status"):
		kind, id = KindStatus, rest[len("clients/"):len(rest)-len("/status")]
	case strings.HasPrefix(rest, "updates/"):
		kind, id = KindUpdate, rest[len("updates/"):]
	case strings.HasPrefix(rest, "receipts/"):
		kind, id = KindReceipt, rest[len("receipts/"):]
	default:
		return KindUnknown, "", fmt.Errorf("%w: %q", ErrBadTopic, topic)
	}
	if err := ValidID(id); err != nil {
		return KindUnknown, "", fmt.Errorf("%w: %q: %w", ErrBadTopic, topic, err)
	}
	return kind, id, nil
}

// ErrTopicMismatch reports a message whose client id is not the one its
// topic names (a client publishing as another, or a misrouted message).
var ErrTopicMismatch = errors.New("wire: message does not match its topic")

// Decode parses topic, decodes b as the message type the topic carries and
// checks that the message's client id is the topic's: the one call an MQTT
// handler needs. The update topic carries four types: KindUpdate comes with
// a *ClientUpdate, *SiteStatistics, *EvalReport or a site's *SecAggMessage
// (a type switch or BodyKind tells them apart); KindReceipt with a *Receipt
// or the aggregator's secagg ShareList (*SecAggMessage of kind 4). Errors wrap ErrBadTopic/ErrBadID, a decoder error, or
// ErrTopicMismatch; the message is nil whenever the error is not.
func (t Topics) Decode(topic string, b []byte, lim Limits) (Kind, Message, error) {
	kind, id, err := t.Parse(topic)
	if err != nil {
		return KindUnknown, nil, err
	}
	var (
		m   Message
		cid string
	)
	switch kind {
	case KindRound:
		r, err := DecodeRound(b, lim)
		if err != nil {
			return kind, nil, err
		}
		m = r
	case KindRun:
		r, err := DecodeRun(b, lim)
		if err != nil {
			return kind, nil, err
		}
		m = r
	case KindStatus:
		s, err := DecodeStatus(b, lim)
		if err != nil {
			return kind, nil, err
		}
		m, cid = s, s.ClientId
	case KindUpdate:
		u, err := DecodeSiteMessage(b, lim)
		if err != nil {
			return kind, nil, err
		}
		m = u
		switch u := u.(type) {
		case *ClientUpdate:
			cid = u.ClientId
		case *SiteStatistics:
			cid = u.ClientId
		case *EvalReport:
			cid = u.ClientId
		case *SecAggMessage:
			if u.Kind == SecAggKindShareList {
				return kind, nil, fmt.Errorf("%w: a secagg ShareList on an update topic", ErrInvalid)
			}
			cid = u.ClientId
		}
	case KindReceipt:
		r, err := DecodeSiteInbox(b, lim)
		if err != nil {
			return kind, nil, err
		}
		m = r
		switch r := r.(type) {
		case *Receipt:
			cid = r.ClientId
		case *SecAggMessage:
			cid = r.ClientId
		}
	}
	if id != "" && cid != id {
		return kind, nil, fmt.Errorf("%w: %q carries a %s of client %q", ErrTopicMismatch, topic, BodyKind(m), cid)
	}
	return kind, m, nil
}
