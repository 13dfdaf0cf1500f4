// Package units holds the small values that every side's config files
// spell the same way: a Duration written "30s". It imports nothing of
// vpcni, so a provider, a cloud's section or the controller's routes
// section can spell a timeout without importing the agent's config
// (internal/config, which names the same type config.Duration).
package units

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration written as "30s" in a config file (or as
// a number of seconds).
type Duration struct{ time.Duration }

// UnmarshalJSON accepts "30s"-style strings and plain seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		d.Duration = v
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds, got %s", b)
	}
	d.Duration = time.Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }
