package agent

import (
	"testing"

	"github.com/edgefl/edgefl/testkit"
)

// TestMain fails the package when its tests pass but leave goroutines
// running (a daemon stopped without stopping all of its own): see
// testkit.VerifyMain.
func TestMain(m *testing.M) { testkit.VerifyMain(m) }
