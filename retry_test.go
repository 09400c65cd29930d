package txlock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

func TestExponentialBackoffBounds(t *testing.T) {
	s := txlock.ExponentialBackoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	require.NoError(t, s.Validate())
	for attempt := 1; attempt <= 80; attempt++ {
		ceil := 50 * time.Millisecond
		if attempt <= 5 {
			ceil = 2 * time.Millisecond << (attempt - 1)
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := s.Backoff(attempt)
			require.GreaterOrEqual(t, d, 2*time.Millisecond, "attempt %d", attempt)
			require.LessOrEqual(t, d, ceil, "attempt %d", attempt)
			seen[d] = true
		}
		if attempt > 1 {
			// Jittered: 200 draws from a range of at least 2ms of
			// nanoseconds are never all equal.
			assert.Greater(t, len(seen), 1, "attempt %d is not jittered", attempt)
		}
	}
	// Zero value: the documented defaults.
	var z txlock.ExponentialBackoff
	require.NoError(t, z.Validate())
	for range 100 {
		d := z.Backoff(100)
		require.GreaterOrEqual(t, d, time.Millisecond)
		require.LessOrEqual(t, d, 64*time.Millisecond)
	}
}

func TestBackoffValidate(t *testing.T) {
	for _, tc := range []struct {
		s    interface{ Validate() error }
		want string
	}{
		{txlock.ExponentialBackoff{Min: time.Second, Max: time.Millisecond}, "Min 1s is greater than Max 1ms"},
		{txlock.ExponentialBackoff{Min: -1}, "must not be negative"},
		{txlock.ConstantBackoff{}, "Interval must be positive"},
		{txlock.ConstantBackoff{Interval: time.Millisecond, Jitter: -1}, "Jitter must not be negative"},
		{txlock.LinearBackoff{Max: time.Second}, "Step must be positive"},
		{txlock.LinearBackoff{Step: time.Second}, "Max must be positive"},
		{txlock.LinearBackoff{Step: time.Second, Max: time.Millisecond}, "Step 1s is greater than Max 1ms"},
	} {
		assert.ErrorContains(t, tc.s.Validate(), tc.want)
	}
}

func TestConstantAndLinearBackoff(t *testing.T) {
	c := txlock.ConstantBackoff{Interval: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}
	l := txlock.LinearBackoff{Step: 3 * time.Millisecond, Max: 10 * time.Millisecond}
	for attempt := 1; attempt < 20; attempt++ {
		d := c.Backoff(attempt)
		assert.GreaterOrEqual(t, d, 10*time.Millisecond)
		assert.LessOrEqual(t, d, 15*time.Millisecond)
		assert.Equal(t, min(time.Duration(attempt)*3*time.Millisecond, 10*time.Millisecond), l.Backoff(attempt))
	}
	assert.Negative(t, txlock.NoRetry.Backoff(1))
}

// One strategy value is shared by many goroutines: run with -race.
func TestBackoffConcurrentUse(t *testing.T) {
	s := txlock.ExponentialBackoff{}
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 1000 {
				if d := s.Backoff(g + i%10); d < time.Millisecond {
					t.Errorf("backoff %v below Min", d)
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
}
