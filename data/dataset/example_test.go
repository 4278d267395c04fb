package dataset_test

import (
	"fmt"

	"github.com/edgefl/edgefl/data/dataset"
)

func ExampleBuild() {
	src, err := dataset.ParseSource("synthetic:1,1")
	if err != nil {
		panic(err)
	}
	part, err := dataset.ParsePartition("dirichlet:0.5")
	if err != nil {
		panic(err)
	}
	f, err := dataset.Build(src, part, dataset.BuildOptions{Clients: 5, Seed: 1})
	if err != nil {
		panic(err)
	}
	train, test := f.Pooled()
	fmt.Println(f.Name)
	fmt.Println(len(f.Clients), "clients,", f.D, "features,", f.Classes, "classes, samples:", train.N+test.N > 30*50)
	// Output:
	// synthetic(1,1), dirichlet:0.5
	// 5 clients, 60 features, 10 classes, samples: true
}

func ExampleParseSource() {
	_, err := dataset.ParseSource("csv:heart.csv")
	fmt.Println(err)
	// Output:
	// source "csv:heart.csv": expected csv:PATH:label=COLUMN[:regression], COLUMN a header name or 0-based index
}
