package lab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/lab/novaapi"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// NICs attached through the lab's os-interface stand-in: the node's VM
// gets a hot-plugged NIC as a hypervisor gives one — an interface with the
// port's MAC, down and without addresses, under a name of its own — whose
// other end is the port on the VPC bridge, under the same port security as
// every VM port. Detach unplugs it wherever it is (deleting the bridge end
// deletes the pair, even from a pod's namespace).

// ComputePath is the compute endpoint's path on the lab's listeners: a
// node reaches Nova at http://127.0.0.1:EndpointPort + ComputePath.
const ComputePath = novaapi.Prefix + "/"

// handler serves Neutron and the os-interface stand-in on one listener.
func (l *Lab) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(novaapi.Prefix+"/", l.Nova.Handler())
	mux.Handle("/", l.API.Handler())
	return mux
}

// server gives a VM of the cluster (device owner compute:*) a Nova server
// ID the stand-in knows; other ports have none.
func (l *Lab) server(owner string) string {
	if !strings.HasPrefix(owner, "compute:") {
		return ""
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	id := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	l.Nova.AddServer(id)
	return id
}

// nicName is a hot-plugged NIC's name in the node: "ens" and the port.
func nicName(portID string) string { return "ens" + strings.ReplaceAll(portID, "-", "")[:8] }

func (l *Lab) plugNIC(server string, port neutronapi.Port) error {
	l.API.Lock()
	var node *Host
	for _, h := range l.hosts {
		if h.InstanceID == server {
			node = h
		}
	}
	l.API.Unlock()
	if node == nil {
		return fmt.Errorf("no lab VM is server %s", server)
	}
	mac, err := net.ParseMAC(port.MACAddress)
	if err != nil {
		return err
	}
	nic := &Host{Name: node.Name + "-" + nicName(port.ID), NS: node.NS, PortID: port.ID, MAC: port.MACAddress,
		ifname: "lp" + strings.ReplaceAll(port.ID, "-", "")[:11]}
	if err := netnsutil.VethBetween(l.vpcNS(), nic.ifname, node.NS, nicName(port.ID), mac); err != nil {
		return fmt.Errorf("hot-plug port %s into %s: %w", port.ID, node.NS, err)
	}
	if err := l.bridge(nic.ifname); err != nil {
		_ = netnsutil.Exec(l.vpcNS(), "ip", "link", "del", nic.ifname)
		return err
	}
	l.API.Lock()
	l.hosts[port.ID] = nic
	l.API.Unlock()
	return nil
}

func (l *Lab) unplugNIC(_ string, port neutronapi.Port) error {
	l.API.Lock()
	nic := l.hosts[port.ID]
	delete(l.hosts, port.ID)
	l.API.Unlock()
	if nic == nil {
		return nil
	}
	if out, err := netnsutil.Output(l.vpcNS(), "ip", "link", "del", nic.ifname); err != nil && !strings.Contains(out, "Cannot find device") {
		return fmt.Errorf("unplug port %s: %v: %s", port.ID, err, strings.TrimSpace(out))
	}
	return nil
}
