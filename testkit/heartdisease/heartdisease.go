// Package heartdisease is a test fixture: the UCI heart-disease data of
// four real hospitals (deploy/hospital), written as site CSVs with a header,
// and a federation schema for them.
package heartdisease

import (
	"embed"
	"os"
	"path/filepath"
)

//go:embed *.data
var files embed.FS

// Sites are the four hospitals, in the aggregator's order (by id).
var Sites = []string{"cleveland", "hungarian", "switzerland", "va"}

// Header names the 14 columns.
const Header = "age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,num"

// Schema is a binary federation schema over the columns FLamby keeps
// (slope, ca and thal are left out, so ignored): disease is num > 0.
// extra is spliced into the chol feature's object (e.g. `"missing": ["0"]`).
func Schema(extra string) string {
	chol := `{"name": "chol", "type": "numeric"}`
	if extra != "" {
		chol = `{"name": "chol", "type": "numeric", ` + extra + `}`
	}
	return `{"task": "binary",
 "features": [{"name": "age", "type": "numeric"}, {"name": "sex", "type": "categorical"},
  {"name": "cp", "type": "categorical"}, {"name": "trestbps", "type": "numeric"}, ` + chol + `,
  {"name": "fbs", "type": "categorical"}, {"name": "restecg", "type": "categorical"},
  {"name": "thalach", "type": "numeric"}, {"name": "exang", "type": "categorical"},
  {"name": "oldpeak", "type": "numeric"}],
 "label": {"column": "num", "classes": [{"name": "no disease", "values": ["0"]}, {"name": "disease", "values": ["1", "2", "3", "4"]}]}}`
}

// Write writes each site's CSV (the header, then the hospital's rows as
// exported) into dir and returns their paths, in Sites order.
func Write(dir string) ([]string, error) {
	var paths []string
	for _, s := range Sites {
		b, err := files.ReadFile("processed." + s + ".data")
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, s+".csv")
		if err := os.WriteFile(p, append([]byte(Header+"\n"), b...), 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}
