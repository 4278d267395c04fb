// Command errlen lists the error and log texts written in the non-test Go
// files (errors.New and fmt.Errorf format strings, log/slog messages)
// longer than a limit, longest first (CONTRIBUTING.md, "Error and log
// messages"); its test fails on any over MaxLen.
//
//	go run ./scripts/errlen [-max 160] [DIR]
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
)

func main() {
	limit := flag.Int("max", MaxLen, "list texts longer than this many characters")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	texts, err := scan(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "errlen:", err)
		os.Exit(1)
	}
	var long []text
	for _, t := range texts {
		if t.Len() > *limit {
			long = append(long, t)
		}
	}
	sort.SliceStable(long, func(i, j int) bool { return long[i].Len() > long[j].Len() })
	for _, t := range long {
		fmt.Printf("%d %s %s %q\n", t.Len(), t.Pos, t.Kind, t.Text)
	}
	fmt.Printf("%d of %d texts over %d characters\n", len(long), len(texts), *limit)
}
