package testkit

import (
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// A line logged after the test (and its cleanups) ended is dropped instead
// of reaching t.Log, which would panic.
func TestLoggerAfterTest(t *testing.T) {
	var log func()
	t.Run("inner", func(t *testing.T) {
		l := Logger(t)
		l.Info("during the test")
		log = func() { l.Info("after the test") }
	})
	log() // would panic "Log in goroutine after TestLoggerAfterTest/inner has completed"
}

func TestSyncBufferLines(t *testing.T) {
	var b SyncBuffer
	if _, err := b.Write([]byte("a x\nb\nc x\npartial x")); err != nil {
		t.Fatal(err)
	}
	if got, want := b.Lines("x"), []string{"a x", "c x"}; !slices.Equal(got, want) {
		t.Errorf("Lines(x) = %q, want %q", got, want)
	}
	if got := b.Lines(""); len(got) != 3 {
		t.Errorf("Lines() = %q", got)
	}
	if got := b.String(); !strings.HasSuffix(got, "partial x") {
		t.Errorf("String() = %q", got)
	}
}

// StartBroker's broker lets a client publish and subscribe, and the leak
// check finds a goroutine left running and nothing once it has stopped.
func TestBrokerAndLeakCheck(t *testing.T) {
	before := goroutines()
	stop := make(chan struct{})
	go func() { <-stop }()
	if leaks := leakedSince(before, 10*time.Millisecond); len(leaks) != 1 || !strings.Contains(leaks[0], "TestBrokerAndLeakCheck") {
		t.Fatalf("leaks %q, want the one goroutine of this test", leaks)
	}
	close(stop)
	if leaks := leakedSince(before, leakWait); len(leaks) != 0 {
		t.Fatalf("leaks after it returned: %q", leaks)
	}

	t.Run("broker", func(t *testing.T) {
		_, url := StartBroker(t)
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("kit"))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		got := make(chan string, 1)
		if tok := c.Subscribe("a/b", 1, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		c.Publish("a/b", 1, false, "hello")
		select {
		case s := <-got:
			if s != "hello" {
				t.Fatalf("got %q", s)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no message")
		}
		c.Disconnect(100)
	})
	// The broker's and paho's goroutines are gone once the subtest's
	// cleanups have run.
	if leaks := leakedSince(before, leakWait); len(leaks) != 0 {
		t.Fatalf("%d goroutines left by the broker and client: %s", len(leaks), strings.Join(leaks, "\n\n"))
	}
}

func TestMain(m *testing.M) { VerifyMain(m) }
