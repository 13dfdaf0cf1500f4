package controller

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The webhook's certificates live in one Secret, so every replica serves
// the same one and a new leader (or a restart) does not mint another. Any
// replica may rotate: writes are compare-and-swap on the Secret's
// resourceVersion, and the loser reads the winner's.
//
// Lifetimes, with L the serving certificate's validity: the CA lives 4L
// and is replaced when less than 2L is left; the serving certificate is
// replaced when less than L/3 is left. A new CA goes into the bundle next
// to the old one (which stays until it expires) and is written into the
// webhook configuration in the same pass, and it signs a serving
// certificate only once it is settle() old (L/10, at most 5 minutes): the
// API server then trusts it before any replica presents a certificate it
// signed. Replicas read the Secret at least once a minute; the certificate
// they still serve meanwhile has at least L/3 - settle() left.
const (
	secretCACert   = "ca.crt"
	secretCAKey    = "ca.key"
	secretCABundle = "ca-bundle.crt"
	secretTLSCert  = "tls.crt"
	secretTLSKey   = "tls.key"
	// backdate covers clocks a little behind ours (the API server's).
	backdate = time.Minute
)

// CertOptions says where the webhook's certificates live and how long
// they last.
type CertOptions struct {
	Namespace string
	// Secret holds the CA and the serving certificate.
	Secret string
	// Service is the webhook's Service: the serving certificate names it.
	Service string
	// WebhookConfig is the MutatingWebhookConfiguration whose caBundle is
	// kept current.
	WebhookConfig string
	// Validity is the serving certificate's lifetime.
	Validity time.Duration
	// Now is the clock (tests move it).
	Now func() time.Time
}

// Validate names every bad field.
func (o CertOptions) Validate() error {
	var errs []error
	if o.Namespace == "" || o.Secret == "" || o.Service == "" || o.WebhookConfig == "" {
		errs = append(errs, errors.New("the webhook's namespace, secret, service and configuration names must all be set"))
	}
	if o.Validity < 10*time.Second {
		errs = append(errs, fmt.Errorf("certificate validity %s is below 10s", o.Validity))
	}
	return errors.Join(errs...)
}

// settle is how old a new CA must be before it signs the serving
// certificate: the caBundle write and the API server picking it up.
func (o CertOptions) settle() time.Duration { return min(o.Validity/10, 5*time.Minute) }

// Certs keeps the webhook's serving certificate: minted, rotated, stored
// in the Secret and served from memory.
type Certs struct {
	cs   kubernetes.Interface
	opts CertOptions
	log  *slog.Logger

	mu   sync.Mutex
	cert *tls.Certificate
	err  error
}

// NewCerts prepares the certificates; Run (or Sync) makes them.
func NewCerts(cs kubernetes.Interface, opts CertOptions, log *slog.Logger) (*Certs, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Certs{cs: cs, opts: opts, log: log.With("component", "webhook-certs"), err: errors.New("no serving certificate yet")}, nil
}

// GetCertificate is for tls.Config: the serving certificate now.
func (c *Certs) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert == nil {
		return nil, c.err
	}
	return c.cert, nil
}

// Ready is nil once a certificate is served and the last pass worked.
func (c *Certs) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert == nil {
		return c.err
	}
	return nil
}

// Run syncs until ctx ends: at the next rotation due, at most a minute
// apart (another replica may have rotated), sooner after an error.
func (c *Certs) Run(ctx context.Context) {
	rec := controllerEvents()
	defer rec.Send(c.cs)()
	webhook := &corev1.ObjectReference{Kind: "MutatingWebhookConfiguration", APIVersion: "admissionregistration.k8s.io/v1", Name: c.opts.WebhookConfig}
	failing := false
	for {
		next, err := c.Sync(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("webhook certificates not in order", "err", err)
			next = 5 * time.Second
			// Told once per run of failures, on the webhook's configuration.
			if !failing {
				rec.Eventf(webhook, corev1.EventTypeWarning, EventWebhookCertificate,
					"vpcni-controller cannot keep the webhook's certificate (Secret %s/%s): %v; a replica without one is not Ready, and pods created while none serves are admitted without their vpcni.io/ip request (VpcniIPNotRequested)", c.opts.Namespace, c.opts.Secret, err)
			}
		}
		failing = err != nil
		c.mu.Lock()
		if c.cert == nil && err != nil {
			c.err = err
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(next, time.Minute)):
		}
	}
}

// EventWebhookCertificate is the Warning on the webhook's configuration
// when its certificate cannot be kept.
const EventWebhookCertificate = "VpcniWebhookCertificate"

// certSet is the Secret's content, parsed.
type certSet struct {
	ca      *x509.Certificate
	caKey   crypto.Signer
	bundle  []*x509.Certificate
	serving *x509.Certificate
	tls     tls.Certificate
}

// Sync makes the Secret current (minting or rotating what is due), loads
// the serving certificate and writes the bundle into the webhook
// configuration. It returns when the next rotation is due.
func (c *Certs) Sync(ctx context.Context) (time.Duration, error) {
	now := c.opts.Now()
	secrets := c.cs.CoreV1().Secrets(c.opts.Namespace)
	sec, err := secrets.Get(ctx, c.opts.Secret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec, err = nil, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read Secret %s/%s: %w", c.opts.Namespace, c.opts.Secret, err)
	}
	set := parseCertSet(sec)
	changed, next, err := c.rotate(set, now)
	if err != nil {
		return 0, err
	}
	if changed {
		data, err := set.encode()
		if err != nil {
			return 0, err
		}
		if sec == nil {
			sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: c.opts.Secret, Namespace: c.opts.Namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "vpcni"}}, Type: corev1.SecretTypeOpaque, Data: data}
			sec, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
		} else {
			sec = sec.DeepCopy()
			sec.Data = data
			sec, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			// Another replica wrote first: use what it wrote.
			return 0, fmt.Errorf("Secret %s/%s written by another replica meanwhile; reading it again: %w", c.opts.Namespace, c.opts.Secret, err)
		}
		if err != nil {
			return 0, fmt.Errorf("write Secret %s/%s: %w", c.opts.Namespace, c.opts.Secret, err)
		}
		c.log.Info("webhook certificates written", "secret", c.opts.Namespace+"/"+c.opts.Secret,
			"ca-expires", set.ca.NotAfter.UTC(), "serving-expires", set.serving.NotAfter.UTC())
	}
	if err := c.patchBundle(ctx, set.bundlePEM()); err != nil {
		return 0, err
	}
	cert := set.tls
	c.mu.Lock()
	c.cert, c.err = &cert, nil
	c.mu.Unlock()
	return next, nil
}

// rotate mints what is missing or due in set; it says whether set changed
// and when the next change is due.
func (c *Certs) rotate(set *certSet, now time.Time) (changed bool, next time.Duration, err error) {
	l := c.opts.Validity
	caLife := 4 * l
	if set.ca == nil || now.After(set.ca.NotAfter.Add(-2*l)) {
		ca, key, err := newCA(now, caLife)
		if err != nil {
			return false, 0, err
		}
		set.ca, set.caKey, changed = ca, key, true
	}
	// The bundle: the current CA and any earlier one still valid, so
	// certificates it signed keep verifying.
	bundle := []*x509.Certificate{set.ca}
	for _, old := range set.bundle {
		if !old.Equal(set.ca) && now.Before(old.NotAfter) {
			bundle = append(bundle, old)
		}
	}
	if !slices.EqualFunc(bundle, set.bundle, func(a, b *x509.Certificate) bool { return a.Equal(b) }) {
		set.bundle, changed = bundle, true
	}
	caAge := now.Sub(set.ca.NotBefore.Add(backdate))
	usable := set.serving != nil && now.Before(set.serving.NotAfter) && set.trusts(set.serving) &&
		slices.Equal(set.serving.DNSNames, c.dnsNames())
	due := !usable || now.After(set.serving.NotAfter.Add(-l/3)) || set.serving.CheckSignatureFrom(set.ca) != nil
	switch {
	case !due:
		next = set.serving.NotAfter.Add(-l / 3).Sub(now)
	case usable && caAge < c.opts.settle():
		// The new CA may not be trusted yet; the current certificate
		// still serves.
		next = c.opts.settle() - caAge
	default:
		set.serving, set.tls, err = newServing(set.ca, set.caKey, c.dnsNames(), now, l)
		if err != nil {
			return false, 0, err
		}
		changed = true
		next = l - l/3
	}
	next = min(next, set.ca.NotAfter.Add(-2*l).Sub(now))
	return changed, max(next, time.Second), nil
}

func (c *Certs) dnsNames() []string {
	s, ns := c.opts.Service, c.opts.Namespace
	return []string{s + "." + ns + ".svc", s + "." + ns + ".svc.cluster.local", s + "." + ns, s}
}

// patchBundle writes the CA bundle into every webhook of the
// configuration that lacks it.
func (c *Certs) patchBundle(ctx context.Context, bundle []byte) error {
	api := c.cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cfg, err := api.Get(ctx, c.opts.WebhookConfig, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read MutatingWebhookConfiguration %s: %w", c.opts.WebhookConfig, err)
	}
	same := true
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
			cfg.Webhooks[i].ClientConfig.CABundle, same = bundle, false
		}
	}
	if same {
		return nil
	}
	if _, err := api.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write the caBundle of MutatingWebhookConfiguration %s: %w", c.opts.WebhookConfig, err)
	}
	c.log.Info("webhook caBundle written", "configuration", c.opts.WebhookConfig, "cas", bytes.Count(bundle, []byte("BEGIN CERTIFICATE")))
	return nil
}

// parseCertSet reads what it can of the Secret; what is missing or
// unreadable is minted again.
func parseCertSet(sec *corev1.Secret) *certSet {
	set := &certSet{}
	if sec == nil {
		return set
	}
	if ca, key, err := parsePair(sec.Data[secretCACert], sec.Data[secretCAKey]); err == nil && ca.IsCA {
		set.ca, set.caKey = ca, key
	}
	for rest := sec.Data[secretCABundle]; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if cert, err := x509.ParseCertificate(b.Bytes); err == nil {
			set.bundle = append(set.bundle, cert)
		}
	}
	if set.ca == nil {
		return set
	}
	if pair, err := tls.X509KeyPair(sec.Data[secretTLSCert], sec.Data[secretTLSKey]); err == nil {
		set.serving, set.tls = pair.Leaf, pair
	}
	return set
}

func (s *certSet) trusts(cert *x509.Certificate) bool {
	for _, ca := range s.bundle {
		if cert.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

func (s *certSet) bundlePEM() []byte {
	var b bytes.Buffer
	for _, ca := range s.bundle {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	}
	return b.Bytes()
}

func (s *certSet) encode() (map[string][]byte, error) {
	caKey, err := x509.MarshalPKCS8PrivateKey(s.caKey)
	if err != nil {
		return nil, err
	}
	tlsKey, err := x509.MarshalPKCS8PrivateKey(s.tls.PrivateKey)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		secretCACert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.ca.Raw}),
		secretCAKey:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKey}),
		secretCABundle: s.bundlePEM(),
		secretTLSCert:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.serving.Raw}),
		secretTLSKey:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: tlsKey}),
	}, nil
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("the key cannot sign")
	}
	return pair.Leaf, key, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newCA(now time.Time, life time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: fmt.Sprintf("vpcni-webhook-ca@%d", now.Unix())},
		NotBefore: now.Add(-backdate), NotAfter: now.Add(life),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func newServing(ca *x509.Certificate, caKey crypto.Signer, names []string, now time.Time, life time.Duration) (*x509.Certificate, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	sn, err := serial()
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-backdate), NotAfter: now.Add(life),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return cert, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, nil
}
