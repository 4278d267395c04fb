package mqttstore

import (
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// The store keeps its own copy of a PUBLISH and hands out copies: what
// the caller (paho's writer, resume) writes to its packet never reaches
// another's. Other packets are kept as given.
func TestCopies(t *testing.T) {
	s := New()
	s.Open()
	defer s.Close()
	pub := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	pub.Qos, pub.TopicName, pub.MessageID, pub.Payload = 1, "t", 7, []byte("x")
	s.Put("o.7", pub)
	pub.Dup, pub.RemainingLength = true, 99 // the writer and resume write to theirs
	got := s.Get("o.7").(*packets.PublishPacket)
	if got == pub || got.Dup || got.RemainingLength != 0 || got.TopicName != "t" || got.MessageID != 7 || string(got.Payload) != "x" {
		t.Fatalf("stored %+v", got)
	}
	got.Dup = true
	if again := s.Get("o.7").(*packets.PublishPacket); again == got || again.Dup {
		t.Fatalf("Get handed out the stored packet: %+v", again)
	}
	sub := packets.NewControlPacket(packets.Subscribe).(*packets.SubscribePacket)
	s.Put("o.8", sub)
	if s.Get("o.8") != sub {
		t.Error("a SUBSCRIBE was copied")
	}
	if s.Get("o.9") != nil {
		t.Error("a missing key gave a packet")
	}
	if keys := s.All(); len(keys) != 2 {
		t.Errorf("keys %v", keys)
	}
}
