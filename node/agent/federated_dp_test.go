package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// declaredFixture is f with its schema's preprocessing declared (what a
// --dp run announces): the transform is prep.Declared of the schema.
func declaredFixture(t *testing.T, minSamples int) *fedFixture {
	t.Helper()
	f := newFedFixture(t, 80)
	js := strings.Replace(fedSchemaJSON, `"min_site_samples": 10`, fmt.Sprintf(`"min_site_samples": %d`, minSamples), 1)
	sc, err := schema.Parse([]byte(strings.Replace(strings.Replace(strings.Replace(js,
		`{"name": "size", "type": "numeric"}`, `{"name": "size", "type": "numeric", "center": 50, "scale": 10}`, 1),
		`{"name": "colour", "type": "categorical"}`, `{"name": "colour", "type": "categorical", "levels": ["red", "green", "blue"]}`, 1),
		`{"name": "age", "type": "numeric"}`, `{"name": "age", "type": "numeric", "center": 50, "scale": 30}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	f.s = sc
	if f.site, err = sitedata.Load(sc, f.csv); err != nil {
		t.Fatal(err)
	}
	if f.tr, err = prep.Declared(sc); err != nil {
		t.Fatal(err)
	}
	f.trRaw, _ = json.Marshal(f.tr)
	if f.spec, err = sitedata.ModelSpec(sc, f.tr, model.KindLogReg, 0, "", 1e-3); err != nil {
		t.Fatal(err)
	}
	return f
}

// With a schema that declares its preprocessing a site sends no statistics
// even when asked (a site error), and trains under the announced DP
// parameters with the declared transform, no statistics phase before.
func TestFederatedDeclaredSchemaUnderDP(t *testing.T) {
	f := declaredFixture(t, 10)
	h := newFedHandler(t, f)
	var emitted []Outgoing
	h.Emit = func(o Outgoing) { emitted = append(emitted, o) }
	_, err := h.Handle(context.Background(), f.statsAnn(fedRun))
	var se *sitedata.SiteError
	if !errors.As(err, &se) || se.Reason != sitedata.ReasonBadTransform || !strings.Contains(se.Public(), "sends no statistics") || len(emitted) != 0 {
		t.Fatalf("statistics of a declared schema: %v (%d emitted)", err, len(emitted))
	}

	const clip = 0.05
	ann := f.trainAnn(t, fedRun, 1, f.global(t, 1))
	ann.Algorithm = AlgoFedAvg
	ann.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: clip, NoiseMultiplier: 1, Delta: 1e-5}
	res, err := h.Handle(context.Background(), ann)
	if err != nil {
		t.Fatal(err)
	}
	if res.Update == nil {
		t.Fatalf("no update: %+v", res)
	}
	u := res.Update
	c, _ := quant.Parse("fp32")
	d, err := c.Decode(u.Vector.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, v := range d {
		n += v * v
	}
	if u.Kind != wire.UpdateKind_UPDATE_KIND_DELTA || math.Sqrt(n) > clip*(1+1e-6) || u.Report.LocalLoss != 0 || len(emitted) != 0 {
		t.Fatalf("update kind %v, norm %v > clip %v, local loss %v", u.Kind, math.Sqrt(n), clip, u.Report.LocalLoss)
	}
}

// With a declared schema no statistics phase refuses a site below
// min_site_samples: it refuses to train instead (too_few_rows), sending
// nothing.
func TestFederatedDeclaredSchemaTooFewRows(t *testing.T) {
	f := declaredFixture(t, 1000)
	h := newFedHandler(t, f)
	var emitted []Outgoing
	h.Emit = func(o Outgoing) { emitted = append(emitted, o) }
	ann := f.trainAnn(t, fedRun, 1, f.global(t, 1))
	ann.Evaluate, ann.EvalRound = true, 0
	res, err := h.Handle(context.Background(), ann)
	var se *sitedata.SiteError
	if !errors.As(err, &se) || se.Reason != sitedata.ReasonTooFewRows || !strings.Contains(se.Public(), "min_site_samples 1000") ||
		res.Update != nil || len(emitted) != 0 {
		t.Fatalf("a site below min_site_samples: %v, update %v, %d emitted", err, res.Update != nil, len(emitted))
	}
}
