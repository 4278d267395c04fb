// Package console is the aggregator's web console: one read-only page at /
// on broker-agg's metrics address, server-rendered from the daemon's
// status and kept current by a little JavaScript that polls /status (the
// same JSON `broker-agg status --addr` reads) and draws its charts as
// inline SVG. Its HTML, CSS and JavaScript are embedded; the page loads
// nothing from elsewhere (its Content-Security-Policy allows only its own
// origin). It also holds the HTTP guards of that address: basic auth
// against a Mosquitto-format password file and client certificate names.
//
// Only broker-agg links it (cmd/edge-agent/deps_test.go forbids
// node/aggregator/... in the gateway binary).
package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"reflect"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
)

//go:embed index.html console.css console.js
var files embed.FS

var page = template.Must(template.New("index.html").Funcs(template.FuncMap{
	"fmtTime": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		case *time.Time:
			if t == nil {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		return "-"
	},
	// partialMeans explains the sites table's Partial column.
	"partialMeans": func() string { return wire.PartialMeans },
	"short": func(s string) string {
		if len(s) > 16 {
			return s[:16] + "…"
		}
		return s
	},
	// online counts the elements of a slice of structs whose Online field is true.
	"online": func(list any) int {
		v := reflect.ValueOf(list)
		if v.Kind() != reflect.Slice {
			return 0
		}
		n := 0
		for i := range v.Len() {
			e := reflect.Indirect(v.Index(i))
			if f := e.FieldByName("Online"); f.IsValid() && f.Kind() == reflect.Bool && f.Bool() {
				n++
			}
		}
		return n
	},
}).ParseFS(files, "index.html"))

// StatusFunc returns the status document: a value the page's template
// reads (the aggregator's Status) and whose JSON the script reads.
type StatusFunc func() (any, error)

// Handler serves the console: the page at / (exactly) and its assets under
// /console/. Mount it on the metrics address's mux.
func Handler(status StatusFunc, now func() time.Time) http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(files, ".")
	assets := http.StripPrefix("/console/", http.FileServerFS(sub))
	mux.Handle("GET /console/console.css", assets)
	mux.Handle("GET /console/console.js", assets)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		st, err := status()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		initial, err := json.Marshal(st) // escapes <, > and &: safe inside <script>
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var buf bytes.Buffer
		if err := page.Execute(&buf, struct {
			Status  any
			Now     time.Time
			Initial template.JS
		}{st, now(), template.JS(initial)}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(buf.Bytes())
	})
	return mux
}

// csp allows the page only its own origin: its script and stylesheet, the
// JSON it polls. The SVG charts are drawn in the page.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Secure sets the headers of every response on the metrics address: the
// console's Content-Security-Policy, no sniffing, no framing, no referrer.
// It also refuses anything but GET and HEAD: the console is read-only.
func Secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "read-only: GET and HEAD only", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}
