package openstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Credentials are checked when the config loads: each problem is named
// by its field, and a file that holds nothing says so (not "cloud
// unreachable" at the first call).
func TestCredentialsCheckedAtLoad(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := file("empty.yaml", "", 0o600)
	comments := file("comments.yaml", "# authURL: https://keystone.example:5000/v3\n\n", 0o600)
	unknown := file("unknown.yaml", "auth_url: https://k/v3\n", 0o600) // clouds.yaml's spelling
	good := file("good.yaml", "authURL: https://k.example:5000/v3\napplicationCredentialID: id\napplicationCredentialSecret: s\n", 0o600)
	halfFile := file("half.yaml", "authURL: https://k.example:5000/v3\napplicationCredentialID: id\n", 0o600)
	unreadable := filepath.Join(dir, "adir") // root reads any file: a directory is what it cannot
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}
	ks := "https://keystone.example:5000/v3"
	for _, c := range []struct {
		name string
		cfg  Config
		want []string // nil: valid
	}{
		{"app cred", Config{Auth: Auth{AuthURL: ks, ApplicationCredentialID: "i", ApplicationCredentialSecret: "s"}}, nil},
		{"user", Config{Auth: Auth{AuthURL: ks, Username: "u", Password: "p", ProjectName: "demo"}}, nil},
		{"file", Config{CredentialsFile: good}, nil},
		{"file completes auth", Config{CredentialsFile: halfFile, Auth: Auth{ApplicationCredentialSecret: "s"}}, nil},
		{"no authURL", Config{Auth: Auth{ApplicationCredentialID: "i", ApplicationCredentialSecret: "s"}},
			[]string{"auth.authURL: is required"}},
		{"bad authURL", Config{Auth: Auth{AuthURL: "keystone:5000", ApplicationCredentialID: "i", ApplicationCredentialSecret: "s"}},
			[]string{`auth.authURL: "keystone:5000" is not an http(s) URL`}},
		{"password without username", Config{Auth: Auth{AuthURL: ks, Password: "p", ProjectName: "demo"}},
			[]string{"auth.username: is required with password"}},
		{"username without password", Config{Auth: Auth{AuthURL: ks, Username: "u", ProjectName: "demo"}},
			[]string{"auth.password: is required with username"}},
		{"user without project", Config{Auth: Auth{AuthURL: ks, Username: "u", Password: "p"}},
			[]string{"auth.projectName: a password login needs the project"}},
		{"app cred id without secret", Config{Auth: Auth{AuthURL: ks, ApplicationCredentialID: "i"}},
			[]string{"auth.applicationCredentialSecret: is required with applicationCredentialID"}},
		{"secret without id", Config{Auth: Auth{AuthURL: ks, ApplicationCredentialSecret: "s"}},
			[]string{"auth.applicationCredentialID: is required with applicationCredentialSecret"}},
		{"no login", Config{Auth: Auth{AuthURL: ks}}, []string{"auth.applicationCredentialID: no login given"}},
		{"two logins", Config{Auth: Auth{AuthURL: ks, ApplicationCredentialID: "i", ApplicationCredentialSecret: "s", Username: "u", Password: "p"}},
			[]string{"auth.username: is set with an application credential"}},
		{"empty file", Config{CredentialsFile: empty}, []string{"credentialsFile: credentials file " + empty + " is empty"}},
		{"comments only", Config{CredentialsFile: comments}, []string{"credentialsFile: credentials file " + comments + " is empty (only comments)"}},
		{"unknown key", Config{CredentialsFile: unknown}, []string{"credentialsFile: " + unknown + ":", `unknown field "auth_url"`, "its keys are those of provider.openstack.auth"}},
		{"half file", Config{CredentialsFile: halfFile},
			[]string{"credentialsFile: " + halfFile + ", key applicationCredentialSecret: is required with applicationCredentialID"}},
		{"missing file", Config{CredentialsFile: filepath.Join(dir, "none.yaml")},
			[]string{"credentialsFile: cannot read " + filepath.Join(dir, "none.yaml"), "no such file"}},
		{"unreadable file", Config{CredentialsFile: unreadable}, []string{"credentialsFile: cannot read " + unreadable + ": read " + unreadable + ": is a directory"}},
		{"relative file", Config{CredentialsFile: "cloud.yaml"}, []string{`credentialsFile: "cloud.yaml" must be an absolute path`}},
	} {
		c.cfg.SubnetID = "s"
		c.cfg.Defaults()
		err := c.cfg.Validate()
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.name, err, w)
			}
		}
	}
}

// The TLS, proxy and catalog settings are checked with the rest.
func TestTransportSettingsValidate(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := Config{Endpoint: "http://n/", SubnetID: "s"}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"defaults", func(*Config) {}, nil},
		{"internal", func(c *Config) { c.EndpointInterface = "internal" }, nil},
		{"bad interface", func(c *Config) { c.EndpointInterface = "private" }, []string{`endpointInterface: "private" is not one of public, internal, admin`}},
		{"proxy", func(c *Config) { c.Proxy = "http://proxy.example:3128" }, nil},
		{"bad proxy", func(c *Config) { c.Proxy = "proxy.example:3128" }, []string{`proxy: "proxy.example:3128" is not an http(s) URL`}},
		{"ca not pem", func(c *Config) { c.CABundle = notPEM }, []string{"caBundle " + notPEM + ": holds no PEM certificate"}},
		{"ca missing", func(c *Config) { c.CABundle = dir + "/none.pem" }, []string{"caBundle: cannot read " + dir + "/none.pem"}},
		{"ca relative", func(c *Config) { c.CABundle = "ca.pem" }, []string{`caBundle: "ca.pem" is neither a PEM certificate nor an absolute path`}},
		{"ca inline bad", func(c *Config) { c.CABundle = "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n" }, []string{"caBundle (inline): holds no PEM certificate"}},
		{"ca and insecure", func(c *Config) { c.CABundle, c.Insecure = notPEM, true }, []string{"insecure: true skips the verification caBundle is for"}},
	} {
		cfg := base
		c.edit(&cfg)
		cfg.Defaults()
		err := cfg.Validate()
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.name, err, w)
			}
		}
	}
	if cfg := (Config{}); func() bool { cfg.Defaults(); return cfg.EndpointInterface != "public" }() {
		t.Errorf("endpointInterface defaults to %q, want public", cfg.EndpointInterface)
	}
}
