package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/proto/wire"
)

// key is an update's identity: (round, client).
type key struct {
	round  uint64
	client string
}

func (k key) String() string { return fmt.Sprintf("(%d, %s)", k.round, k.client) }

// observer is a separate MQTT client (Mosquitto user "observer", read-only
// on the federation's prefix) that records every receipt and update the
// broker routes, with a persistent session so that a broker restart loses
// nothing it was sent.
type observer struct {
	t      *testing.T
	client mqtt.Client
	topics wire.Topics

	mu       sync.Mutex
	receipts []*wire.Receipt
	updates  map[key][]byte // the last copy of each
	bad      int
}

func newObserver(t *testing.T, brokerURL, federation, password string) *observer {
	t.Helper()
	topics, err := wire.ForFederation(federation)
	if err != nil {
		t.Fatal(err)
	}
	o := &observer{t: t, topics: topics, updates: map[key][]byte{}}
	subscribed := make(chan error, 1)
	opts := mqtt.NewClientOptions().AddBroker(brokerURL).
		SetClientID("observer-" + federation).SetUsername("observer").SetPassword(password).
		SetCleanSession(false).SetOrderMatters(false).
		SetAutoReconnect(true).SetMaxReconnectInterval(time.Second).SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond).
		SetDefaultPublishHandler(o.onMessage).
		SetOnConnectHandler(func(c mqtt.Client) {
			tok := c.SubscribeMultiple(map[string]byte{topics.Prefix() + "receipts/+": 1, topics.UpdateFilter(): 1}, o.onMessage)
			var err error
			if !tok.WaitTimeout(10 * time.Second) {
				err = fmt.Errorf("subscribe timed out")
			} else {
				err = tok.Error()
			}
			select {
			case subscribed <- err:
			default:
			}
		})
	o.client = mqtt.NewClient(opts)
	tok := o.client.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		t.Fatal("observer: connect timed out")
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("observer: connect: %v", err)
	}
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("observer: subscribe: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("observer: no subscription")
	}
	t.Cleanup(func() { o.client.Disconnect(100) })
	return o
}

func (o *observer) onMessage(_ mqtt.Client, m mqtt.Message) {
	kind, id, err := o.topics.Parse(m.Topic())
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.bad++
		return
	}
	switch kind {
	case wire.KindReceipt:
		r, err := wire.DecodeReceipt(m.Payload(), wire.Limits{})
		if err != nil || r.ClientId != id {
			o.bad++
			return
		}
		o.receipts = append(o.receipts, r)
	case wire.KindUpdate:
		u, err := wire.DecodeUpdate(m.Payload(), wire.Limits{})
		if err != nil || u.ClientId != id {
			return // the bad-input test sends these on purpose
		}
		o.updates[key{u.Round, u.ClientId}] = slices.Clone(m.Payload())
	}
}

// accepted returns the (round, client) of every accepted receipt (STORED or
// DUPLICATE) seen so far.
func (o *observer) accepted() map[key]wire.ReceiptCode {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[key]wire.ReceiptCode{}
	for _, r := range o.receipts {
		if r.Accepted {
			if _, ok := out[key{r.Round, r.ClientId}]; !ok {
				out[key{r.Round, r.ClientId}] = r.Code
			}
		}
	}
	return out
}

// update returns the last copy of client's update for round.
func (o *observer) update(client string, round uint64) ([]byte, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, ok := o.updates[key{round, client}]
	return b, ok
}
