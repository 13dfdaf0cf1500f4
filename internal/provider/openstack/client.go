package openstack

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
)

// NoAuthClient is a Neutron client for an endpoint without Keystone (a
// neutron-server with auth_strategy noauth, the lab's endpoint): requests
// carry no token and go to endpoint's v2.0/. A missing trailing slash is
// added, since gophercloud appends resource paths to the endpoint as is.
func NoAuthClient(endpoint string, httpClient http.Client) *gophercloud.ServiceClient {
	if !strings.HasSuffix(endpoint, "/") {
		endpoint += "/"
	}
	pc := &gophercloud.ProviderClient{HTTPClient: httpClient}
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: endpoint, ResourceBase: endpoint + "v2.0/", Type: "network"}
}

// NoAuthComputeClient is a Nova client for an endpoint without Keystone
// (the lab's), e.g. http://127.0.0.1:9696/compute/v2.1/.
func NoAuthComputeClient(endpoint string, httpClient http.Client) *gophercloud.ServiceClient {
	if !strings.HasSuffix(endpoint, "/") {
		endpoint += "/"
	}
	pc := &gophercloud.ProviderClient{HTTPClient: httpClient}
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: endpoint, Type: "compute"}
}

// clients builds a Neutron client and, when the mode attaches NICs, a Nova
// client (nil otherwise): noauth against Endpoint and ComputeEndpoint, or
// through Keystone's catalog.
func clients(ctx context.Context, cfg Config, rt http.RoundTripper) (nc, cc *gophercloud.ServiceClient, err error) {
	httpc := http.Client{Transport: rt, Timeout: cfg.Timeout.Duration}
	if cfg.Endpoint != "" {
		nc = NoAuthClient(cfg.Endpoint, httpc)
		if cfg.ComputeEndpoint != "" {
			cc = NoAuthComputeClient(cfg.ComputeEndpoint, httpc)
		}
		return nc, cc, nil
	}
	a, err := cfg.credentials()
	if err != nil {
		return nil, nil, err
	}
	avail, err := cfg.availability()
	if err != nil {
		return nil, nil, err
	}
	opts := gophercloud.AuthOptions{
		IdentityEndpoint: a.AuthURL, AllowReauth: true,
		ApplicationCredentialID: a.ApplicationCredentialID, ApplicationCredentialSecret: a.ApplicationCredentialSecret,
		Username: a.Username, Password: a.Password, DomainName: a.UserDomainName,
	}
	if a.Username != "" {
		opts.Scope = &gophercloud.AuthScope{ProjectID: a.ProjectID, ProjectName: a.ProjectName, DomainName: a.ProjectDomainName}
		if opts.DomainName == "" {
			opts.DomainName = "Default"
		}
		if a.ProjectName != "" && opts.Scope.DomainName == "" {
			opts.Scope.DomainName = "Default"
		}
	}
	pc, err := gcos.NewClient(a.AuthURL)
	if err != nil {
		return nil, nil, fmt.Errorf("Keystone %s: %w", a.AuthURL, err)
	}
	pc.HTTPClient = httpc
	actx, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	if err := gcos.Authenticate(actx, pc, opts); err != nil {
		return nil, nil, explain(fmt.Errorf("Keystone login at %s: %w", a.AuthURL, err))
	}
	eo := gophercloud.EndpointOpts{Region: a.Region, Availability: avail}
	nc, err = gcos.NewNetworkV2(pc, eo)
	if err != nil {
		return nil, nil, fmt.Errorf("no Neutron endpoint of interface %s in the Keystone catalog (region %q; provider.openstack.endpointInterface picks public, internal or admin): %w", avail, a.Region, err)
	}
	if cfg.usesNova() {
		if cc, err = gcos.NewComputeV2(pc, eo); err != nil {
			return nil, nil, fmt.Errorf("no Nova (compute) endpoint of interface %s in the Keystone catalog (region %q), which mode %s needs to attach ports to the VM: %w", avail, a.Region, cfg.Mode, err)
		}
	}
	return nc, cc, nil
}
