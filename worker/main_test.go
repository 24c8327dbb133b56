package worker

import (
	"os"
	"testing"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestMain removes the models testenv.Models generated for this package's tests (its
// children reuse the parent's directory and leave it alone).
func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }
