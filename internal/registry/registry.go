// Package registry is the by-name table that datapath modes and providers
// register themselves in (tailscale's hook pattern): the agent and the
// config look a name up and never list the implementations themselves.
package registry

import (
	"fmt"
	"sort"
	"sync"
)

// Registry maps names to one kind of implementation.
type Registry[T any] struct {
	kind string
	mu   sync.RWMutex
	m    map[string]T
}

// New returns an empty registry of kind (used in messages, e.g.
// "datapath mode").
func New[T any](kind string) *Registry[T] { return &Registry[T]{kind: kind, m: map[string]T{}} }

// Register adds v under name; packages call it from init. A name
// registered twice is a programming error.
func (r *Registry[T]) Register(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		panic(r.kind + " " + name + " registered twice")
	}
	r.m[name] = v
}

// Lookup finds name, or says which names this build knows.
func (r *Registry[T]) Lookup(name string) (T, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[name]
	if !ok {
		return v, fmt.Errorf("%q is not a %s this build knows (known: %v)", name, r.kind, r.namesLocked())
	}
	return v, nil
}

// Names lists the registered names, sorted.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.namesLocked()
}

func (r *Registry[T]) namesLocked() []string {
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
