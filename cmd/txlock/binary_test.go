package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBinary builds the command as go install would, and runs it: key
// prints what the in-process run prints, --help exits 0, and a bad command
// line exits 2.
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "txlock")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	got, err := exec.Command(bin, "key", "--keyspace", "billing", "inv-7").Output()
	require.NoError(t, err)
	want := cli(t, "key", "--keyspace", "billing", "inv-7")
	require.Equal(t, 0, want.code)
	assert.Equal(t, want.stdout, string(got))

	help, err := exec.Command(bin, "--help").Output()
	require.NoError(t, err, "--help exits 0")
	assert.Contains(t, string(help), "Commands:")

	err = exec.Command(bin, "key", "--nope").Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 2, exit.ExitCode())
}
