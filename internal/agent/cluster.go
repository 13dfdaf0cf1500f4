package agent

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/store"
)

// Cluster is the orchestrator the agent reports to (Kubernetes, see
// internal/k8s). The agent calls it after the fact and never waits on it:
// a slow or absent API server must not slow a pod's ADD. Without one the
// agent runs on its own.
type Cluster interface {
	// Changed: the attachment's allocation was made or released.
	Changed(containerID, ifName string)
	// Failed: setting up a pod's network failed, for the reason given.
	Failed(podNamespace, podName string, err *api.Error)
	// Ready is nil while the cluster side works, else why it does not.
	Ready() error
}

// SetCluster connects the agent to its orchestrator; call it before Run.
func (a *Agent) SetCluster(c Cluster) { a.cluster = c }

// Attachment is what the agent tells the cluster about one pod address.
type Attachment struct {
	ContainerID  string
	IfName       string
	PodNamespace string
	PodName      string
	PodUID       string
	Address      netip.Addr
	Gateway      netip.Addr
	MAC          string
	Netns        string
	Ready        bool
	Created      time.Time
}

// Attachment returns the recorded attachment, nil if there is none.
func (a *Agent) Attachment(containerID, ifName string) (*Attachment, error) {
	r, err := a.store.Get(containerID, ifName)
	if err != nil || r == nil {
		return nil, err
	}
	return attachmentView(r), nil
}

// Attachments lists every recorded attachment.
func (a *Agent) Attachments() ([]*Attachment, error) {
	records, err := a.store.List()
	if err != nil {
		return nil, err
	}
	out := make([]*Attachment, 0, len(records))
	for _, r := range records {
		out = append(out, attachmentView(r))
	}
	return out, nil
}

func attachmentView(r *store.Record) *Attachment {
	return &Attachment{
		ContainerID: r.ContainerID, IfName: r.IfName, PodNamespace: r.PodNamespace, PodName: r.PodName, PodUID: r.PodUID,
		Created: r.Created, Address: r.Address, Gateway: datapath.Gateway, MAC: datapath.PodMAC(attachmentOf(r)).String(),
		Netns: r.Netns, Ready: r.Ready,
	}
}

// Release frees an attachment the runtime will not delete any more (its
// pod is gone and vpcni-controller said so): the same as a DEL. created is
// the record the decision was made on: a newer record of the same
// attachment is left alone.
func (a *Agent) Release(containerID, ifName string, created time.Time, why string) error {
	unlock := a.locks.Lock(store.Key(containerID, ifName))
	defer unlock()
	rec, err := a.store.Get(containerID, ifName)
	if err != nil || rec == nil || !rec.Created.Equal(created) {
		return err
	}
	if err := a.release(rec); err != nil {
		return fmt.Errorf("release %s: %w", rec.Address, err)
	}
	a.log.Info("released the address of a pod that is gone", "container", containerID, "ifName", ifName, "address", rec.Address, "pod", rec.PodNamespace+"/"+rec.PodName, "why", why)
	a.changed(rec)
	a.kickRefill()
	return nil
}

// PoolFigures is the node's pool, for node annotations.
type PoolFigures struct {
	Free, Cooling, Allocated, Capacity int
	ProviderPort                       string
}

// Pool returns the pool's figures now.
func (a *Agent) Pool() PoolFigures {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.pool.Counts()
	return PoolFigures{Free: c.Free, Cooling: c.Cooling, Allocated: c.Allocated, Capacity: a.capacity, ProviderPort: a.providerPortLocked()}
}

// ProviderPort is the cloud port the node's pod addresses live on ("" for
// providers without one).
func (a *Agent) ProviderPort() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.providerPortLocked()
}

func (a *Agent) providerPortLocked() string {
	if p, ok := a.prov.(interface{ PortID() string }); ok {
		return p.PortID()
	}
	return ""
}

func (a *Agent) changed(rec *store.Record) {
	if a.cluster != nil && rec.PodName != "" {
		a.cluster.Changed(rec.ContainerID, rec.IfName)
	}
}

func (a *Agent) failed(req *api.CNIRequest, aerr *api.Error) {
	if a.cluster == nil || aerr == nil || req == nil {
		return
	}
	if ns, name, _ := k8sPod(req.Args); name != "" {
		a.cluster.Failed(ns, name, aerr)
	}
}
