package interop_test

import (
	"os"
	"testing"

	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
