// Package bundle is the model bundle: one
// self-describing JSON file holding everything needed to use a trained
// model at a site.
//
// # Format (versions 1 and 2)
//
//	{
//	  "format": "edgefl-bundle",
//	  "version": 1,             // 2 when "privacy" is present
//	  "model": {"kind": ..., "inputs": ..., "classes": ..., "layout": ..., "weights": [...]},
//	  "schema": {...},          // the federation schema (label mapping included)
//	  "transform": {...},       // prep.Transform, the fitted preprocessing
//	  "evaluation": {"round": R, "federation": {...}, "sites": {"site-a": {...}},
//	                 "missing": ["site-d"]},   // version 3: awaited, no report
//	  "provenance": {"federation": ..., "run_id": ..., "round": R, "algorithm": ...,
//	                 "params": {"l2": "0.01", ...}, "edgefl_version": ..., "time": RFC 3339,
//	                 "statistics_sites": ["site-a", ...]},  // version 3

//	  "privacy": {...},         // version 2: a --dp run's guarantee (Privacy); then no "evaluation"
//	  "digest": "sha256 hex"
//	}
//
// Version 2 added "privacy" (privacy.go): the differential-privacy
// guarantee of a model trained with --dp. Marshal writes version 1 when a
// bundle has no privacy field, so an edgefl that reads only version 1
// still reads every bundle of a run without --dp; Read accepts both and
// refuses a privacy field in a version 1 bundle and an evaluation next to
// a privacy field (a private bundle releases no per-site or federation
// figure: docs/privacy.md, "Evaluation under DP").
//
// Version 3 added what keeps the figures honest: each evaluation report's
// "baseline" (evaluate.Baseline: the majority class's accuracy, or the
// rows' mean for regression, and whether the model beats it), the
// evaluation's "missing" (the sites whose report was awaited and had not
// come when the figures were made: the figures cover "sites" only) and the
// provenance's "statistics_sites" (whose statistics made the
// preprocessing; a site not in it joined later and its rows shaped none
// of it). Marshal writes version 3 only when one of them is present, so
// bundles without them stay readable by an older edgefl.
//
// The model's inputs are the transform's outputs in its documented order;
// class k of the model is the schema's class k, reported as its first raw
// value. Weights are float64 written as the shortest decimal that parses
// back to the same value, so a round trip is exact.
//
// digest is the hex SHA-256 of the bundle's JSON encoding (encoding/json,
// fields in this order, maps sorted, no indentation) with "digest" empty.
// Read recomputes it and refuses a mismatch, an unknown format or version,
// unknown fields and an inconsistent content (model inputs not the
// transform's outputs, classes not the schema's, a transform of another
// schema, non-finite weights). Write is atomic: temporary file, fsync,
// rename, fsync of the directory.
package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// Format and Version identify the file format: Version is the newest this
// edgefl reads and writes, VersionPlain the version of a bundle without a
// privacy field.
const (
	Format         = "edgefl-bundle"
	Version        = 3
	VersionPlain   = 1
	VersionPrivacy = 2 // adds "privacy"
	VersionFigures = 3 // adds the reports' "baseline", the evaluation's "missing", the provenance's "statistics_sites"
)

// MaxBytes bounds a bundle read from disk or the network.
const MaxBytes = 256 << 20

// Evaluation is the federated evaluation at the bundle's round.
type Evaluation struct {
	Round      int                        `json:"round"`
	Federation evaluate.Report            `json:"federation"`
	Sites      map[string]evaluate.Report `json:"sites,omitempty"`
	// Missing are the sites whose report was awaited and had not come
	// when the figures were made (version 3): the figures cover Sites.
	Missing []string `json:"missing,omitempty"`
}

// Provenance says where the model comes from.
type Provenance struct {
	Federation    string            `json:"federation"`
	RunID         string            `json:"run_id"`
	Round         int               `json:"round"`
	Algorithm     string            `json:"algorithm"`
	Params        map[string]string `json:"params,omitempty"`
	EdgeflVersion string            `json:"edgefl_version"`
	Time          string            `json:"time"` // RFC 3339, UTC
	// StatisticsSites are the sites whose statistics made the
	// preprocessing (version 3; none when the schema declares it).
	StatisticsSites []string `json:"statistics_sites,omitempty"`
}

// Bundle is a model bundle. Build one with its fields and Marshal or
// Write; Read and Unmarshal verify it.
type Bundle struct {
	Format     string          `json:"format"`
	Version    int             `json:"version"`
	Model      model.Saved     `json:"model"`
	Schema     *schema.Schema  `json:"schema"`
	Transform  *prep.Transform `json:"transform"`
	Evaluation *Evaluation     `json:"evaluation,omitempty"`
	Provenance Provenance      `json:"provenance"`
	Privacy    *Privacy        `json:"privacy,omitempty"`
	Digest     string          `json:"digest"`
}

func (b *Bundle) digest() (string, error) {
	c := *b
	c.Digest = ""
	raw, err := json.Marshal(&c)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:]), nil
}

// Check verifies the bundle's content is consistent (not its digest).
func (b *Bundle) Check() error {
	if b.Format != Format {
		return fmt.Errorf("format %q, expected %q", b.Format, Format)
	}
	if err := checkVersion(b.Version); err != nil {
		return err
	}
	if b.Privacy != nil {
		switch {
		case b.Version < 2:
			return fmt.Errorf("bundle version %d with a privacy field (version 2 adds it)", b.Version)
		case b.Evaluation != nil:
			return errors.New("a bundle with a privacy guarantee carries no evaluation (the sites' figures are outside the guarantee)")
		}
		if err := b.Privacy.check(); err != nil {
			return err
		}
	}
	if b.hasFigures() && b.Version < VersionFigures {
		return fmt.Errorf("bundle version %d with baselines, missing sites or statistics sites (version %d adds them)", b.Version, VersionFigures)
	}
	if b.Schema == nil || b.Transform == nil {
		return errors.New("no schema or no transform")
	}
	if err := b.Schema.Validate(); err != nil {
		return wrapErr("schema", err)
	}
	if err := b.Transform.Validate(b.Schema); err != nil {
		return err
	}
	if _, _, err := model.Load(bytes.NewReader(mustJSON(b.Model))); err != nil {
		return err
	}
	if b.Model.Inputs != b.Transform.Outputs {
		return fmt.Errorf("model has %d inputs, the transform gives %d", b.Model.Inputs, b.Transform.Outputs)
	}
	switch k := b.Schema.NumClasses(); {
	case k == 0 && b.Model.Kind != model.KindLinear:
		return fmt.Errorf("a regression schema with a %s model", b.Model.Kind)
	case k == 2 && b.Model.Kind == model.KindBinaryLogReg:
	case k > 0 && b.Model.Kind == model.KindLinear:
		return fmt.Errorf("a %s schema with a linear model", b.Schema.Task)
	case k > 0 && b.Model.Classes != k:
		return fmt.Errorf("model has %d classes, the schema %d", b.Model.Classes, k)
	}
	return nil
}

// hasFigures reports whether b holds a field of version 3.
func (b *Bundle) hasFigures() bool {
	if len(b.Provenance.StatisticsSites) > 0 {
		return true
	}
	e := b.Evaluation
	if e == nil {
		return false
	}
	if len(e.Missing) > 0 || e.Federation.Baseline != nil {
		return true
	}
	for _, r := range e.Sites {
		if r.Baseline != nil {
			return true
		}
	}
	return false
}

// checkVersion refuses a version this edgefl does not read.
func checkVersion(v int) error {
	if v < VersionPlain || v > Version {
		return fmt.Errorf("bundle version %d, this edgefl reads versions %d to %d", v, VersionPlain, Version)
	}
	return nil
}

func mustJSON(v any) []byte {
	raw, _ := json.Marshal(v) // Saved holds finite floats only after checks
	return raw
}

// Marshal checks b, sets its format, version (VersionPlain without a
// privacy field) and digest, and encodes it.
func (b *Bundle) Marshal() ([]byte, error) {
	b.Format, b.Version = Format, VersionPlain
	if b.Privacy != nil {
		b.Version = VersionPrivacy
	}
	if b.hasFigures() {
		b.Version = VersionFigures
	}
	if err := b.Check(); err != nil {
		return nil, wrapErr("bundle", err)
	}
	d, err := b.digest()
	if err != nil {
		return nil, wrapErr("bundle", err)
	}
	b.Digest = d
	raw, err := json.Marshal(b)
	if err != nil {
		return nil, wrapErr("bundle", err)
	}
	return append(raw, '\n'), nil
}

// Unmarshal decodes and verifies a bundle (digest, version, content).
func Unmarshal(raw []byte) (*Bundle, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var b Bundle
	if err := dec.Decode(&b); err != nil {
		return nil, wrapErr("not a bundle", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not a bundle: data after the bundle")
	}
	if b.Format != Format {
		return nil, fmt.Errorf("not a bundle: format %q, expected %q", b.Format, Format)
	}
	if err := checkVersion(b.Version); err != nil {
		return nil, err
	}
	d, err := b.digest()
	if err != nil {
		return nil, err
	}
	if d != b.Digest {
		return nil, fmt.Errorf("digest mismatch: the file says %.16s, its content hashes to %.16s (corrupted or edited)", b.Digest, d)
	}
	if err := b.Check(); err != nil {
		return nil, err
	}
	return &b, nil
}

// Read reads and verifies the bundle at path; errors are one line naming
// the file.
func Read(path string) (*Bundle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapErr("bundle", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", path, err)
	}
	if len(raw) > MaxBytes {
		return nil, fmt.Errorf("bundle %s: larger than %d bytes", path, MaxBytes)
	}
	b, err := Unmarshal(raw)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", path, err)
	}
	return b, nil
}

// Write marshals b to path atomically: nothing half-written on error.
func Write(path string, b *Bundle) error {
	raw, err := b.Marshal()
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, raw)
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, fsynced, renamed over path, then fsyncs the directory; an
// error from that last step means path holds data but may not survive a
// crash.
func WriteFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	ok = true
	// The rename is durable only once the directory is: an error here
	// leaves the new file in place but not yet safe from a crash, and is
	// returned as storage's compaction returns it.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return nil
}
