package controller

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

func certFixture(t *testing.T, validity time.Duration) (*fake.Clientset, *testClock, func() *Certs) {
	cs := fake.NewClientset(&admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "vpcni"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "pods.vpcni.io"}, {Name: "other.vpcni.io"}},
	})
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	replica := func() *Certs {
		c, err := NewCerts(cs, CertOptions{Namespace: "vpcni-system", Secret: "vpcni-webhook-cert", Service: "vpcni-webhook",
			WebhookConfig: "vpcni", Validity: validity, Now: clock.now}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return cs, clock, replica
}

// served is what replica c presents now, and whether the API server, with
// the caBundle of every webhook in the configuration, accepts it for the
// Service's name at that time.
func served(t *testing.T, cs *fake.Clientset, c *Certs, now time.Time) (*x509.Certificate, error) {
	t.Helper()
	cert, err := c.GetCertificate(nil)
	if err != nil {
		t.Fatalf("no certificate served: %v", err)
	}
	cfg, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "vpcni", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wh := range cfg.Webhooks {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(wh.ClientConfig.CABundle) {
			t.Fatalf("webhook %s: no caBundle", wh.Name)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "vpcni-webhook.vpcni-system.svc", CurrentTime: now}); err != nil {
			return cert.Leaf, err
		}
	}
	return cert.Leaf, nil
}

// Over many lifetimes, checked every second: whatever either replica
// serves is trusted by the caBundle the API server has, the serving
// certificate and the CA both get replaced, and the bundle carries an old
// CA only while it is valid.
func TestCertRotation(t *testing.T) {
	const validity = 30 * time.Second
	cs, clock, replica := certFixture(t, validity)
	a, b := replica(), replica()
	if a.Ready() == nil {
		t.Fatal("ready before any certificate")
	}
	ctx := context.Background()
	serials, cas := map[string]bool{}, map[string]bool{}
	maxBundle := 0
	var first *x509.Certificate
	for step := 0; step < 600; step++ { // 20 serving lifetimes, 5 CA lifetimes
		now := clock.t
		for name, c := range map[string]*Certs{"a": a, "b": b} {
			if _, err := c.Sync(ctx); err != nil {
				t.Fatalf("%s: replica %s: %v", now, name, err)
			}
			leaf, err := served(t, cs, c, now)
			if err != nil {
				t.Fatalf("%s: replica %s serves %s (expires %s), not trusted by the caBundle: %v", now, name, leaf.Subject, leaf.NotAfter, err)
			}
			if left := leaf.NotAfter.Sub(now); left < validity/4 {
				t.Fatalf("%s: replica %s serves a certificate with only %s left", now, name, left)
			}
			serials[leaf.SerialNumber.String()] = true
		}
		sec, err := cs.CoreV1().Secrets("vpcni-system").Get(ctx, "vpcni-webhook-cert", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		set := parseCertSet(sec)
		cas[set.ca.SerialNumber.String()] = true
		for _, ca := range set.bundle {
			if now.After(ca.NotAfter) {
				t.Fatalf("%s: the bundle keeps a CA that expired at %s", now, ca.NotAfter)
			}
		}
		maxBundle = max(maxBundle, len(set.bundle))
		// A new CA signs only once the API server had time to load the
		// bundle with it (but the very first CA cannot wait).
		if step == 0 {
			first = set.ca
		}
		leaf, _ := a.GetCertificate(nil)
		for _, ca := range set.bundle {
			if leaf.Leaf.CheckSignatureFrom(ca) == nil && !ca.Equal(first) {
				if age := leaf.Leaf.NotBefore.Sub(ca.NotBefore); age < 3*time.Second {
					t.Fatalf("%s: served certificate signed by a CA %s old", now, age)
				}
			}
		}
		clock.t = now.Add(time.Second)
	}
	// 600s of 30s certificates renewed when 10s are left: one per 20s.
	if len(serials) < 25 || len(cas) < 4 || maxBundle != 2 {
		t.Errorf("%d serving certificates, %d CAs, bundle up to %d: want >= 25, >= 4, 2", len(serials), len(cas), maxBundle)
	}
	t.Logf("600s: %d serving certificates, %d CAs, bundle of up to %d CAs", len(serials), len(cas), maxBundle)
}

// Replicas agree: the second adopts the first's certificate instead of
// minting another, and a Secret with garbage is minted again.
func TestCertsSharedAndRepaired(t *testing.T) {
	cs, clock, replica := certFixture(t, time.Hour)
	a, b := replica(), replica()
	ctx := context.Background()
	if _, err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	ca, _ := a.GetCertificate(nil)
	cb, _ := b.GetCertificate(nil)
	if !ca.Leaf.Equal(cb.Leaf) {
		t.Fatal("two replicas serve different certificates")
	}
	sec, _ := cs.CoreV1().Secrets("vpcni-system").Get(ctx, "vpcni-webhook-cert", metav1.GetOptions{})
	sec.Data = map[string][]byte{secretCACert: []byte("garbage"), secretTLSCert: []byte("more")}
	if _, err := cs.CoreV1().Secrets("vpcni-system").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if leaf, err := served(t, cs, b, clock.t); err != nil || leaf.Equal(ca.Leaf) {
		t.Fatalf("after the Secret was spoiled: %v (same certificate: %v)", err, leaf.Equal(ca.Leaf))
	}
}

func TestCertOptionsValidate(t *testing.T) {
	err := CertOptions{Validity: time.Second}.Validate()
	if err == nil || !strings.Contains(err.Error(), "names must all be set") || !strings.Contains(err.Error(), "below 10s") {
		t.Errorf("Validate = %v, want both problems named", err)
	}
}

// A replica that cannot keep the certificate says so once, as a Warning
// on the webhook's configuration, however many passes fail.
func TestCertsFailureEvent(t *testing.T) {
	cs := fake.NewClientset() // no MutatingWebhookConfiguration: every pass fails
	c, err := NewCerts(cs, CertOptions{Namespace: "vpcni-system", Secret: "vpcni-webhook-cert", Service: "vpcni-webhook",
		WebhookConfig: "vpcni", Validity: time.Hour}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second) // two failed passes, 5 s apart
	defer cancel()
	c.Run(ctx)
	evs, err := cs.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs.Items {
		got = append(got, e.Reason+" on "+e.InvolvedObject.Kind+" "+e.InvolvedObject.Name+": "+e.Message)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], EventWebhookCertificate+" on MutatingWebhookConfiguration vpcni: ") || c.Ready() == nil {
		t.Fatalf("events %q (ready: %v), want one %s on the webhook's configuration", got, c.Ready(), EventWebhookCertificate)
	}
}
