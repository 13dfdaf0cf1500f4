package config

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/snat"
)

// Provider picks where addresses come from and holds that provider's own
// section: `provider: {type: openstack, openstack: {...}}`. The section's
// type belongs to the provider's package (registered by name); this
// package knows none of them.
type Provider struct {
	Type     string
	Settings provider.Settings
}

// Datapath picks the pod wiring mode and holds its own section:
// `datapath: veth`, or `datapath: {mode: veth, veth: {...}}`.
type Datapath struct {
	Mode     string
	Settings datapath.Settings
}

// settings is what both kinds of section are.
type settings interface {
	Defaults()
	Validate() error
}

// UnmarshalJSON reads {"type": T, "<T>": {...}} on top of what p holds.
func (p *Provider) UnmarshalJSON(b []byte) error {
	return decodeSection(b, "type", &p.Type, &p.Settings, provider.NewSettings)
}

// MarshalJSON writes {"type": T, "<T>": {...}}.
func (p Provider) MarshalJSON() ([]byte, error) { return encodeSection("type", p.Type, p.Settings) }

// UnmarshalJSON reads "mode" or {"mode": M, "<M>": {...}} on top of what
// d holds.
func (d *Datapath) UnmarshalJSON(b []byte) error {
	if s := ""; json.Unmarshal(b, &s) == nil {
		if s != d.Mode {
			d.Mode, d.Settings = s, nil
		}
		return nil
	}
	return decodeSection(b, "mode", &d.Mode, &d.Settings, datapath.NewSettings)
}

// MarshalJSON writes {"mode": M, "<M>": {...}}, or just "M" when the
// mode's section holds nothing but its defaults: the short form is what
// the previous release reads, so a config written by this one (the
// testbed's, a tool's) still starts that release's vpcnid.
func (d Datapath) MarshalJSON() ([]byte, error) {
	if d.Settings == nil {
		return json.Marshal(d.Mode)
	}
	if def, err := datapath.NewSettings(d.Mode); err == nil {
		def.Defaults()
		a, err1 := json.Marshal(def)
		b, err2 := json.Marshal(d.Settings)
		if err1 == nil && err2 == nil && bytes.Equal(a, b) {
			return json.Marshal(d.Mode)
		}
	}
	return encodeSection("mode", d.Mode, d.Settings)
}

// decodeSection reads a selector key and at most one section, named after
// the selected implementation, strictly (an unknown field is an error, as
// everywhere in the file). A section for another implementation than the
// selected one is an error too: it would be ignored silently.
func decodeSection[S settings](b []byte, key string, name *string, s *S, newSettings func(string) (S, error)) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	if raw, ok := fields[key]; ok {
		var n string
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if n != *name {
			var zero S
			*name, *s = n, zero
		}
		delete(fields, key)
	}
	for k, raw := range fields {
		if k != *name {
			return fmt.Errorf("section %q is for another %s than the one selected (%s: %q); remove it or select it", k, key, key, *name)
		}
		if any(*s) == nil {
			ns, err := newSettings(k)
			if err != nil {
				return err
			}
			*s = ns
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(*s); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

func encodeSection(key, name string, s settings) ([]byte, error) {
	m := map[string]any{key: name}
	if s != nil {
		m[name] = s
	}
	return json.Marshal(m)
}

// validate fills the provider's defaults and names its bad fields.
func (p *Provider) validate() []error {
	empty, err := provider.NewSettings(p.Type)
	if err != nil {
		return []error{fmt.Errorf("provider.type: %w", err)}
	}
	if p.Settings == nil {
		p.Settings = empty
	}
	return validateSection("provider."+p.Type, p.Settings)
}

// validate fills the mode's defaults and names its bad fields.
func (d *Datapath) validate() []error {
	empty, err := datapath.NewSettings(d.Mode)
	if err != nil {
		return []error{fmt.Errorf("datapath: %w", err)}
	}
	if d.Settings == nil {
		d.Settings = empty
	}
	return validateSection("datapath."+d.Mode, d.Settings)
}

// validateSection runs a section's Defaults and Validate and puts the
// section's path in front of each error, so every bad field is named from
// the top of the file.
func validateSection(path string, s settings) []error {
	s.Defaults()
	err := s.Validate()
	if err == nil {
		return nil
	}
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, len(list))
	for i, e := range list {
		out[i] = fmt.Errorf("%s.%w", path, e)
	}
	return out
}

// nopDefaults is a section whose defaults are its zero value (snat), for
// validateSection's naming of its fields.
type nopDefaults struct{ snat.Config }

func (nopDefaults) Defaults() {}
