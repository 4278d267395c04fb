package aggregator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/mqttstore"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// mqttTimeout bounds every wait on a paho token.
const mqttTimeout = 30 * time.Second

func (s *Server) clientOptions() *mqtt.ClientOptions {
	o := mqtt.NewClientOptions().
		AddBroker(s.cfg.BrokerURL).
		SetClientID(s.cfg.ClientID).
		SetCleanSession(false).    // the broker queues updates while we restart
		SetStore(mqttstore.New()). // paho's store, without its data race (internal/mqttstore)
		SetOrderMatters(false).
		SetAutoAckDisabled(true). // acknowledged once durable (see onMessage)
		SetConnectRetry(true).
		SetConnectRetryInterval(2 * time.Second).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(30 * time.Second).
		SetKeepAlive(30 * time.Second).
		SetConnectTimeout(10 * time.Second).
		SetWriteTimeout(10 * time.Second).
		SetProtocolVersion(4).
		SetDefaultPublishHandler(s.onMessage).
		SetOnConnectHandler(s.onConnect).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			s.log.Warn("lost the broker connection; reconnecting", "broker", s.cfg.BrokerURL, "err", err)
		}).
		SetReconnectingHandler(func(mqtt.Client, *mqtt.ClientOptions) {
			s.log.Debug("reconnecting to the broker", "broker", s.cfg.BrokerURL)
		}).
		SetConnectionNotificationHandler(s.onConnNotification)
	if s.cfg.Username != "" {
		o.SetUsername(s.cfg.Username).SetPassword(s.cfg.Password)
	}
	if s.cfg.TLS != nil {
		o.SetTLSConfig(s.cfg.TLS)
	}
	if dial := s.cfg.Dial; dial != nil {
		o.SetCustomOpenConnectionFn(func(*url.URL, mqtt.ClientOptions) (net.Conn, error) { return dial() })
	}
	return o
}

// connect waits for the first connection (paho retries in the background).
func (s *Server) connect(ctx context.Context) error {
	tok := s.client.Connect()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				return fmt.Errorf("aggregator: connect to %s: %w", s.cfg.BrokerURL, err)
			}
			s.log.Info("connected to the broker", "broker", s.cfg.BrokerURL, "client_id", s.cfg.ClientID)
			select { // and subscribed: Ready means the server hears clients
			case <-s.subscribed:
			case <-ctx.Done():
			}
			return nil
		case <-tick.C:
			s.log.Warn("still waiting for the broker (check its address, TLS settings and credentials)", "broker", s.cfg.BrokerURL, "client_id", s.cfg.ClientID)
		case <-ctx.Done():
			s.client.Disconnect(0)
			return nil
		}
	}
}

// onConnect (re)subscribes; paho runs it on its own goroutine.
func (s *Server) onConnect(c mqtt.Client) {
	filters := map[string]byte{s.topics.StatusFilter(): 1, s.topics.UpdateFilter(): 1}
	tok := c.SubscribeMultiple(filters, s.onMessage)
	if !tok.WaitTimeout(mqttTimeout) {
		s.log.Error("subscribing timed out", "filters", filters)
		return
	}
	if err := tok.Error(); err != nil {
		s.log.Error("subscribing failed", "err", err)
		return
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		for f, code := range st.Result() {
			if code >= 0x80 {
				s.log.Error("the broker refused a subscription (check the ACL gives the aggregator's identity the whole prefix)", "filter", f, "code", code)
			}
		}
	}
	s.fed.connected()
	s.log.Info("subscribed", "status", s.topics.StatusFilter(), "updates", s.topics.UpdateFilter())
	s.subOnce.Do(func() { close(s.subscribed) })
}

// publish sends a QoS 1 message; its completion is watched in the
// background (a failure is logged and counted: announcements are re-sent
// on restart, receipts on the client's re-send).
func (s *Server) publish(topic string, retained bool, payload []byte, what string) {
	if payload == nil {
		payload = []byte{}
	}
	tok := s.client.Publish(topic, 1, retained, payload)
	ctx := s.runCtx
	go func() {
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				s.publishErrors.Add(1)
				s.log.Error("publish failed", "what", what, "topic", topic, "err", err)
			}
		case <-ctx.Done():
		}
	}()
}

// handle decodes and validates one message and, if it is a status or a
// plausible update, hands it to the loop. It reports whether the message
// was dealt with (false: the server stopped).
func (s *Server) handle(topic string, payload []byte) bool {
	kind, id, err := s.topics.Parse(topic)
	label := "other"
	if err == nil {
		label = kind.String()
	}
	s.bytesIn.Add(label, uint64(len(payload)))
	s.bytesInTotal.Add(uint64(len(payload)))
	s.msgsIn.Inc(label)
	if err == nil && id != "" {
		s.hist.seen(id, s.clock.Now())
	}
	switch {
	case err != nil:
		s.log.Warn("message on an unexpected topic ignored", "topic", topic, "err", err)
		if strings.HasPrefix(topic, s.topics.Prefix()+"updates/") {
			s.reject("", "bad_topic")
		}
		return true
	case kind == wire.KindStatus:
		if len(payload) == 0 {
			return true // a cleared retained status
		}
		_, msg, err := s.topics.Decode(topic, payload, s.dec.Load().lim)
		if err != nil {
			s.badStatus.Add(1)
			s.log.Warn("bad status message ignored", "topic", topic, "client", id, "bytes", len(payload), "err", err)
			return true
		}
		return s.submit(&request{status: msg.(*wire.ClientStatus)})
	case kind == wire.KindUpdate:
		return s.handleUpdate(topic, id, payload)
	default:
		s.log.Debug("ignoring message", "topic", topic, "kind", kind)
		return true
	}
}

// decodeReason classifies a wire decoding error as a metric label.
func decodeReason(err error) string {
	switch {
	case errors.Is(err, wire.ErrTopicMismatch):
		return "topic_mismatch"
	case errors.Is(err, wire.ErrUnsupportedVersion):
		return "unsupported_version"
	case errors.Is(err, wire.ErrTooLarge):
		return "too_large"
	case errors.Is(err, wire.ErrMalformed), errors.Is(err, wire.ErrWrongType):
		return "malformed"
	case errors.Is(err, wire.ErrInvalid):
		return "invalid"
	case errors.Is(err, wire.ErrBadTopic), errors.Is(err, wire.ErrBadID):
		return "bad_topic"
	}
	return "malformed"
}

// frameReason classifies a quant decoding error as a metric label.
func frameReason(err error) string {
	switch {
	case errors.Is(err, quant.ErrCorrupt) && strings.Contains(err.Error(), "not finite"):
		return "non_finite"
	case errors.Is(err, quant.ErrCorrupt):
		return "corrupt_payload"
	case errors.Is(err, quant.ErrTruncated):
		return "truncated_payload"
	case errors.Is(err, quant.ErrChecksum):
		return "bad_checksum"
	case errors.Is(err, quant.ErrTooLarge):
		return "payload_too_large"
	case errors.Is(err, quant.ErrDimension):
		return "wrong_dimension"
	}
	return "bad_frame" // format, version, codec
}

// ShellReasons lists the rejection reasons the shell itself counts (the
// coordinator's are Reasons()), for zero-valued metrics.
func ShellReasons() []string {
	return []string{"bad_topic", "topic_mismatch", "unsupported_version", "too_large", "malformed", "invalid",
		"unsupported_kind", "wrong_dimension", "non_finite", "corrupt_payload", "truncated_payload",
		"bad_checksum", "payload_too_large", "bad_frame", "base_mismatch", "out_of_range", "internal", "duplicate_instance"}
}

// deltaKind is the delta kind of the federation's family.
func (s *Server) deltaKind() wire.UpdateKind {
	if s.cfg.DP != nil && isSplit(s.fam) {
		return wire.UpdateKind_UPDATE_KIND_SUM_DELTA // sum mode (server_sum.go)
	}
	if isSplit(s.fam) {
		return wire.UpdateKind_UPDATE_KIND_Z_DELTA
	}
	return wire.UpdateKind_UPDATE_KIND_DELTA
}

// handleUpdate validates an update in the callback's goroutine: envelope,
// topic/client id, kind, dimension, frame, finiteness. What fails before
// the round is known gets a log line and a counter; what fails after gets a
// BAD_UPDATE receipt too. The rest goes to the loop (client and round
// checks by the coordinator, durable write, receipt).
func (s *Server) handleUpdate(topic, id string, payload []byte) bool {
	dec := s.dec.Load()
	_, msg, err := s.topics.Decode(topic, payload, dec.lim)
	if err != nil {
		reason := decodeReason(err)
		s.reject(id, reason)
		s.log.Warn("update rejected before decoding", "topic_client", id, "reason", reason, "bytes", len(payload), "err", err)
		return true
	}
	var u *wire.ClientUpdate
	switch m := msg.(type) {
	case *wire.ClientUpdate:
		u = m
		if !s.instanceUpdate(u) {
			return true // another installation with this site's id: set aside
		}
	case *wire.SiteStatistics:
		return s.handleStatistics(m, payload)
	case *wire.EvalReport:
		return s.handleEval(m, payload)
	case *wire.SecAggMessage:
		return s.handleSecAgg(m, payload)
	default:
		s.reject(id, "malformed")
		return true
	}
	bad := func(reason, detail string) bool {
		s.reject(u.ClientId, reason)
		s.log.Warn("update rejected", "client", u.ClientId, "round", u.Round, "reason", reason, "detail", detail)
		s.receipt(u, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, reason+": "+detail, time.Time{})
		return true
	}
	if dec.dim == 0 {
		// The statistics phase: no model, no round announced yet.
		s.reject(u.ClientId, coordinator.FutureRound.String())
		s.log.Warn("update rejected", "client", u.ClientId, "round", u.Round, "reason", coordinator.FutureRound.String(), "detail", "the statistics phase: no round is announced yet")
		s.receipt(u, false, wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND, "future_round: the statistics phase is on", time.Time{})
		return true
	}
	if want := s.deltaKind(); u.Kind != want && (u.Kind != wire.UpdateKind_UPDATE_KIND_FULL || s.cfg.DP != nil) {
		// Under DP a FULL vector would be neither a clipped delta nor
		// against the site's record.
		return bad("unsupported_kind", fmt.Sprintf("kind %v; this %s federation takes %v", u.Kind, s.fam, want))
	}
	if int(u.Vector.Dimension) != dec.dim {
		return bad("wrong_dimension", fmt.Sprintf("dimension %d, the model has %d", u.Vector.Dimension, dec.dim))
	}
	if info, err := quant.Inspect(u.Vector.Payload); err == nil && info.Dim != dec.dim {
		return bad("wrong_dimension", fmt.Sprintf("frame of dimension %d, the model has %d", info.Dim, dec.dim))
	}
	c := dec.codecs.Get().(*quant.Codec)
	vec, err := c.Decode(u.Vector.Payload, nil)
	defer dec.codecs.Put(c)
	if err != nil {
		return bad(frameReason(err), err.Error())
	}
	if len(vec) != dec.dim {
		return bad("wrong_dimension", fmt.Sprintf("decoded %d values, the model has %d", len(vec), dec.dim))
	}
	for i, v := range vec {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return bad("non_finite", fmt.Sprintf("value %d is %v", i, v))
		}
	}
	if s.otherRun(u) {
		return true
	}
	if reason, detail := s.scaffoldCheck(u, c, dec.dim); reason != "" {
		return bad(reason, detail)
	}
	// Valid, and receipted already: answered from memory, without the event
	// loop or a store read (a flood of one valid update costs a decode).
	if s.duplicate(u) {
		return true
	}
	return s.submit(&request{update: &inUpdate{msg: u, raw: payload, vec: vec}})
}
