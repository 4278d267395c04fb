package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

const exampleConf = "../../deploy/edge-agent.example.conf"

func TestExampleConfigDocumentsEveryOption(t *testing.T) {
	b, err := os.ReadFile(exampleConf)
	if err != nil {
		t.Fatal(err)
	}
	file, err := readConfig(bytes.NewReader(b), exampleConf)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, o := range options() {
		if !strings.Contains(text, "\n"+o.key+" =") && !strings.Contains(text, "\n# "+o.key+" =") {
			t.Errorf("option %s is not in %s", o.key, exampleConf)
		}
	}
	cfg, err := buildConfig(file, nil, "v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the example does not validate: %v", err)
	}
	if cfg.SiteID != "hospital-north" || cfg.Federation != "ward-7" || !slices.Equal(cfg.Brokers, []string{"ssl://agg.ward7.example:8883"}) ||
		cfg.CertFile != "/etc/edgefl/pki/clients/hospital-north.crt" || cfg.PasswordFile != "" || cfg.Local.MaxSeconds != 120 ||
		cfg.Local.DeadlineMargin != time.Second || cfg.DataClient != -1 || cfg.SoftwareVersion != "v1.2.3" || cfg.LogFormat != "text" {
		t.Fatalf("example parsed as %+v", cfg)
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	base := "site_id = s1\nfederation = f\nbroker = tcp://a:1883\nstate_file = s.db\ndata = synthetic:1,1\ndata_client = 2\n"
	tests := []struct {
		name  string
		file  string
		flags []string
		check func(c runConfig) bool
		err   string
	}{
		{name: "file only", file: base, check: func(c runConfig) bool {
			return c.SiteID == "s1" && c.DataClient == 2 && c.DataPartition == "natural" && c.Seed == 1
		}},
		{name: "flag overrides file", file: base, flags: []string{"--site-id", "s2", "--max-epochs", "7", "--reconnect-max", "5"},
			check: func(c runConfig) bool {
				return c.SiteID == "s2" && c.Local.MaxEpochs == 7 && c.ReconnectMax == 5*time.Second
			}},
		{name: "broker lines accumulate", file: base + "broker = tcp://b:1883, tcp://c:1883\n",
			check: func(c runConfig) bool {
				return slices.Equal(c.Brokers, []string{"tcp://a:1883", "tcp://b:1883", "tcp://c:1883"})
			}},
		{name: "broker flag replaces the list", file: base, flags: []string{"--broker", "tcp://x:1", "--broker", "tcp://y:1"},
			check: func(c runConfig) bool { return slices.Equal(c.Brokers, []string{"tcp://x:1", "tcp://y:1"}) }},
		{name: "hyphenated keys and comments", file: "# c\n\n  site-id = s3  \n" + base[len("site_id = s1\n"):],
			check: func(c runConfig) bool { return c.SiteID == "s3" }},
		{name: "durations", file: base + "keepalive = 1m\nconnect_timeout = 2.5\ndeadline_margin = -1\n",
			check: func(c runConfig) bool {
				return c.KeepAlive == time.Minute && c.ConnectTimeout == 2500*time.Millisecond && c.Local.DeadlineMargin < 0
			}},
		{name: "password flag replaces the file's password_file", file: base + "username = u\npassword_file = /nonexistent\n", flags: []string{"--password", "p"},
			check: func(c runConfig) bool { return c.Password == "p" && c.PasswordFile == "" }},
		{name: "json logs", file: base, flags: []string{"--log-format", "json"}, check: func(c runConfig) bool { return c.LogFormat == "json" }},
		{name: "schema data, eval data and model out", file: base + "eval_data = /srv/heldout.csv\nmodel_out = /srv/final.json\n",
			flags: []string{"--data", "csv:/srv/site.csv", "--data-client", "-1"},
			check: func(c runConfig) bool {
				return c.Data == "csv:/srv/site.csv" && c.EvalData == "/srv/heldout.csv" && c.ModelOut == "/srv/final.json"
			}},
		{name: "eval data as csv:PATH", file: base + "eval_data = csv:/srv/heldout.csv\n",
			flags: []string{"--data", "csv:/srv/site.csv", "--data-client", "-1"},
			check: func(c runConfig) bool { return c.EvalData == "csv:/srv/heldout.csv" }},
		{name: "eval data with a label", file: base + "eval_data = csv:/srv/heldout.csv:label=dx\n",
			flags: []string{"--data", "csv:/srv/site.csv", "--data-client", "-1"}, err: "eval_data"},
		{name: "eval data of a synthetic source", file: base + "eval_data = /srv/heldout.csv\n", err: "eval_data"},
		{name: "unknown key", file: base + "site = x\n", err: `:7: unknown option "site"`},
		{name: "no equals", file: base + "site_id\n", err: ":7: expected key = value"},
		{name: "duplicate", file: base + "site_id = s9\n", err: ":7: site_id is already set at"},
		{name: "bad integer", file: base + "max_epochs = many\n", err: ":7: max_epochs"},
		{name: "negative seconds", file: base, flags: []string{"--max-seconds", "-3"}, err: "--max-seconds: max_seconds"},
		{name: "NaN", file: base + "lr = NaN\n", err: "lr"},
		{name: "bad duration", file: base + "keepalive = soon\n", err: "keepalive"},
		{name: "bad log format", file: base + "log_format = xml\n", err: "log_format"},
		{name: "missing site", file: base[len("site_id = s1\n"):], err: "site id"},
		{name: "bad site id", file: base, flags: []string{"--site-id", "a/b"}, err: "site id"},
		{name: "bad broker scheme", file: base, flags: []string{"--broker", "http://a"}, err: "scheme"},
		{name: "tls on a plain URL", file: base + "tls_ca = ca.pem\n", err: "not a TLS URL"},
		{name: "cert without key", file: "site_id = s1\nfederation = f\nbroker = ssl://a:8883\nstate_file = s.db\ntls_cert = c.pem\n", err: "cert and key"},
		{name: "bad solver", file: base + "solver = adam\n", err: "solver"},
		{name: "bad log level", file: base + "log_level = loud\n", err: "log level"},
		{name: "both passwords", file: base + "username = u\npassword = p\npassword_file = x\n", err: "both set"},
		{name: "missing password file", file: base + "username = u\npassword_file = /nonexistent/pw\n", err: "password_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "agent.conf")
			testkit.WriteFile(t, path, tt.file)
			fs := newFlagSet()
			flags := addOptionFlags(fs)
			if err := fs.Parse(tt.flags); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadConfig(path, *flags, "test")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("config %+v", cfg)
			}
		})
	}
}

func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	pw := testkit.WriteFileIn(t, dir, "pw", "s3cret\n")
	fs := newFlagSet()
	flags := addOptionFlags(fs)
	args := []string{"--site-id", "s", "--federation", "f", "--broker", "tcp://a:1", "--state-file", "x.db", "--username", "u", "--password-file", pw}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig("", *flags, "test")
	if err != nil || cfg.Password != "s3cret" {
		t.Fatalf("password %q, %v", cfg.Password, err)
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := testkit.WriteFileIn(t, dir, "bad.conf", "site_id = s\nfrobnicate = 1\n")
	noData := testkit.WriteFileIn(t, dir, "nodata.conf", "site_id = s\nfederation = f\nbroker = tcp://127.0.0.1:1\nstate_file = "+filepath.Join(dir, "s.db")+"\ndata = csv:"+filepath.Join(dir, "none.csv")+":label=y\n")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no config", []string{"run"}, 2, "--config FILE is required"},
		{"stray argument", []string{"run", "--config", bad, "extra"}, 2, `unexpected argument "extra"`},
		{"unknown flag", []string{"run", "--colour", "red"}, 2, "flag provided but not defined"},
		{"missing file", []string{"run", "--config", filepath.Join(dir, "nope.conf")}, 1, "nope.conf"},
		{"unknown option", []string{"run", "--config", bad}, 1, `bad.conf:2: unknown option "frobnicate"`},
		{"missing data", []string{"run", "--config", noData}, 1, "none.csv"},
		{"help", []string{"run", "--help"}, 0, "usage: edge-agent run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %d (want %d), stderr:\n%s\nwant %q", code, tt.code, stderr.String(), tt.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "s.db")); err == nil {
				t.Fatal("a state file was created by a run that could not start")
			}
		})
	}
}

// TestRunDaemon runs `edge-agent run --config FILE` against an in-process
// broker: it comes online with its CSV data, and on cancellation (what
// SIGINT/SIGTERM do through main's context) goes offline and exits 0.
func TestRunDaemon(t *testing.T) {
	_, url := testkit.StartBroker(t)

	topics, _ := wire.ForFederation("ward")
	statusTopic, _ := topics.Status("clinic-1")
	status := make(chan *wire.ClientStatus, 10)
	watcher := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("watcher").
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			if s, err := wire.DecodeStatus(m.Payload(), wire.Limits{}); err == nil {
				status <- s
			}
		}))
	wait := func(tok mqtt.Token) {
		t.Helper()
		select {
		case <-tok.Done():
			if tok.Error() != nil {
				t.Fatal(tok.Error())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("MQTT timeout")
		}
	}
	wait(watcher.Connect())
	defer watcher.Disconnect(100)
	wait(watcher.Subscribe(statusTopic, 1, nil))
	next := func() *wire.ClientStatus {
		t.Helper()
		select {
		case s := <-status:
			return s
		case <-time.After(20 * time.Second):
			t.Fatal("no status")
		}
		return nil
	}

	dir := t.TempDir()
	csv := testkit.WriteFileIn(t, dir, "clinic.csv", "age,bp,y\n50,120,0\n61,140,1\n45,118,0\n70,150,1\n")
	conf := filepath.Join(dir, "agent.conf")
	state := filepath.Join(dir, "state.db")
	testkit.WriteFile(t, conf, "site_id = clinic-1\nfederation = ward\nbroker = tcp://127.0.0.1:1\n"+
		"state_file = "+state+"\ndata = csv:"+csv+":label=y\nsolver = lbfgs\n")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--config", conf, "--broker", url, "--log-level", "debug"}, io.Discard, &stderr)
	}()

	s := next()
	first := s
	if !s.Online || s.SampleCount != 4 || !slices.Equal(s.Capabilities, []string{"lbfgs"}) || s.SoftwareVersion != version {
		t.Fatalf("online status %v", s)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	// The online status can arrive twice (live, and retained when the test's
	// subscription lands after the publish); the offline one must follow.
	for s := next(); s.Online; s = next() {
		if s.Connection != first.Connection {
			t.Fatalf("status after shutdown %v", s)
		}
	}
	st, err := edgestore.OpenEdge(state, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if id, err := st.Identity(); err != nil || id.ClientID != "clinic-1" {
		t.Fatalf("identity %v, %v", id, err)
	}
	if !strings.Contains(stderr.String(), "connected") {
		t.Fatalf("log:\n%s", stderr.String())
	}
}

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// Both systemd units wait for the clock (docs/operations.md, "Clocks"): ordered
// after time-sync.target and pulling it in, so that with
// systemd-time-wait-sync enabled a Raspberry Pi without a hardware clock
// starts the daemon only once NTP has set the time.
func TestSystemdUnitsWaitForTimeSync(t *testing.T) {
	for _, unit := range []string{"edge-agent.service", "broker-agg.service"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		var after, wants []string
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "After="); ok {
				after = append(after, strings.Fields(v)...)
			}
			if v, ok := strings.CutPrefix(line, "Wants="); ok {
				wants = append(wants, strings.Fields(v)...)
			}
		}
		if !slices.Contains(after, "time-sync.target") || !slices.Contains(wants, "time-sync.target") {
			t.Errorf("%s: After=%v Wants=%v, want time-sync.target in both", unit, after, wants)
		}
		if !strings.Contains(string(raw), "systemctl enable systemd-time-wait-sync") {
			t.Errorf("%s does not say to enable systemd-time-wait-sync (without it time-sync.target waits for nothing)", unit)
		}
	}
}
