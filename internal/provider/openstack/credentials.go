package openstack

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// credentials is the Keystone login: auth, with what credentialsFile says
// over it. The file is a mounted Secret: it is read when the config loads
// (Validate), so a missing, empty or misspelt one is named then, and at
// every connect, so a rotated Secret is picked up.
func (o *Config) credentials() (Auth, error) {
	a := o.Auth
	if o.CredentialsFile == "" {
		return a, nil
	}
	data, err := os.ReadFile(o.CredentialsFile)
	if err != nil {
		return a, fmt.Errorf("credentialsFile: cannot read %s: %w (is the Secret with the cloud's credentials mounted there?)", o.CredentialsFile, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return a, fmt.Errorf("credentialsFile: credentials file %s is empty: it needs authURL and an application credential "+
			"(applicationCredentialID, applicationCredentialSecret) or a user (username, password, projectName)", o.CredentialsFile)
	}
	var file Auth
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		return a, fmt.Errorf("credentialsFile: %s: %w (its keys are those of provider.openstack.auth: authURL, region, "+
			"applicationCredentialID, applicationCredentialSecret, username, password, userDomainName, projectID, projectName, projectDomainName)",
			o.CredentialsFile, err)
	}
	if file == (Auth{}) {
		return a, fmt.Errorf("credentialsFile: credentials file %s is empty (only comments): it needs authURL and an application credential "+
			"(applicationCredentialID, applicationCredentialSecret) or a user (username, password, projectName)", o.CredentialsFile)
	}
	for _, f := range []struct{ to, from *string }{
		{&a.AuthURL, &file.AuthURL}, {&a.Region, &file.Region},
		{&a.ApplicationCredentialID, &file.ApplicationCredentialID}, {&a.ApplicationCredentialSecret, &file.ApplicationCredentialSecret},
		{&a.Username, &file.Username}, {&a.Password, &file.Password}, {&a.UserDomainName, &file.UserDomainName},
		{&a.ProjectID, &file.ProjectID}, {&a.ProjectName, &file.ProjectName}, {&a.ProjectDomainName, &file.ProjectDomainName},
	} {
		if *f.from != "" {
			*f.to = *f.from
		}
	}
	return a, nil
}

// checkCredentials names each missing or contradictory login field, where
// it is set: auth.<field>, or the credentials file and its key.
func (o *Config) checkCredentials() []error {
	if o.CredentialsFile != "" && !filepath.IsAbs(o.CredentialsFile) {
		return []error{fmt.Errorf("credentialsFile: %q must be an absolute path", o.CredentialsFile)}
	}
	a, err := o.credentials()
	if err != nil {
		return []error{err}
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		where := "auth." + field
		if o.CredentialsFile != "" {
			where = fmt.Sprintf("credentialsFile: %s, key %s", o.CredentialsFile, field)
		}
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, args...)...))
	}
	if a.AuthURL == "" {
		bad("authURL", "is required: Keystone's URL, e.g. https://keystone.example:5000/v3")
	} else if u, err := url.Parse(a.AuthURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("authURL", "%q is not an http(s) URL", a.AuthURL)
	}
	appCred := a.ApplicationCredentialID != "" || a.ApplicationCredentialSecret != ""
	user := a.Username != "" || a.Password != ""
	switch {
	case appCred && user:
		bad("username", "is set with an application credential: give one login, the application credential (preferred) or the user")
	case a.ApplicationCredentialID != "" && a.ApplicationCredentialSecret == "":
		bad("applicationCredentialSecret", "is required with applicationCredentialID")
	case a.ApplicationCredentialSecret != "" && a.ApplicationCredentialID == "":
		bad("applicationCredentialID", "is required with applicationCredentialSecret")
	case a.Password != "" && a.Username == "":
		bad("username", "is required with password")
	case a.Username != "" && a.Password == "":
		bad("password", "is required with username")
	case user && a.ProjectID == "" && a.ProjectName == "":
		bad("projectName", "a password login needs the project to work in: projectName or projectID")
	case !appCred && !user:
		bad("applicationCredentialID", "no login given: an application credential (applicationCredentialID and applicationCredentialSecret) or a user (username, password, projectName)")
	}
	return errs
}
