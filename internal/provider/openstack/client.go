package openstack

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"sigs.k8s.io/yaml"
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

// client builds a Neutron client: noauth against Endpoint, or through
// Keystone.
func client(ctx context.Context, cfg Config, rt http.RoundTripper) (*gophercloud.ServiceClient, error) {
	httpc := http.Client{Transport: rt, Timeout: cfg.Timeout.Duration}
	if cfg.Endpoint != "" {
		return NoAuthClient(cfg.Endpoint, httpc), nil
	}
	a := cfg.Auth
	if cfg.CredentialsFile != "" {
		data, err := os.ReadFile(cfg.CredentialsFile)
		if err != nil {
			return nil, fmt.Errorf("OpenStack credentials: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &a); err != nil {
			return nil, fmt.Errorf("OpenStack credentials %s: %w", cfg.CredentialsFile, err)
		}
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
		return nil, fmt.Errorf("Keystone %s: %w", a.AuthURL, err)
	}
	pc.HTTPClient = httpc
	actx, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	if err := gcos.Authenticate(actx, pc, opts); err != nil {
		return nil, explain(fmt.Errorf("Keystone login at %s: %w", a.AuthURL, err))
	}
	nc, err := gcos.NewNetworkV2(pc, gophercloud.EndpointOpts{Region: a.Region})
	if err != nil {
		return nil, fmt.Errorf("no Neutron endpoint in the Keystone catalog (region %q): %w", a.Region, err)
	}
	return nc, nil
}
