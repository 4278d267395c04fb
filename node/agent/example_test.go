package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/node/agent"
)

// Several agents in one process, as `broker-agg demo` runs them: each has
// its own state file and gets its synthetic client's data directly.
func ExampleNew() {
	fed, err := dataset.Synthetic(dataset.SyntheticConfig{Alpha: 1, Beta: 1, Devices: 5, Seed: 1})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range fed.Clients {
		cfg := agent.DefaultConfig()
		cfg.SiteID, cfg.Federation = c.ID, "demo"
		cfg.Brokers = []string{"tcp://127.0.0.1:1883"} // the embedded broker
		cfg.StateFile = filepath.Join("demo-state", c.ID+".db")
		a, err := agent.New(cfg, agent.Deps{Data: &c.Train})
		if err != nil {
			panic(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil {
				fmt.Println(err)
			}
		}()
	}
	// ... run the aggregator until done, then:
	cancel()
	wg.Wait()
}
