package aggregator

import (
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// invite publishes d's invitation on the site's receipts topic (the
// broker's ACL lets only that site read it): a Receipt of subject
// INVITATION naming the round and the run (docs/privacy.md, "Sampling
// rate"). Not retained: the coordinator repeats it whenever the site may
// have missed it (extension, reconnection, restart), and the agent takes a
// repeat as it takes a repeated announcement.
func (s *Server) invite(d coordinator.Invite) {
	topic, err := s.topics.Receipt(d.Client)
	if err != nil {
		s.log.Error("invitation to an invalid client id", "client", d.Client, "err", err)
		return
	}
	b, err := wire.Encode(&wire.Receipt{ClientId: d.Client, Round: uint64(d.Round),
		Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_INVITATION, RunId: s.stored.RunID})
	if err != nil {
		s.log.Error("encoding an invitation", "client", d.Client, "err", err)
		return
	}
	s.hist.sent(uint64(len(b)))
	s.log.Debug("invitation sent", "client", d.Client, "round", d.Round)
	s.publish(topic, false, b, "invitation")
}
