package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// NewRESTClient builds a REST client of this API group from cfg, with
// the parameter codec its list and watch options need. It speaks JSON:
// the API server serves custom resources as JSON (or CBOR), never
// protobuf, whatever cfg prefers.
func NewRESTClient(cfg *rest.Config) (rest.Interface, runtime.ParameterCodec, error) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		return nil, nil, fmt.Errorf("register %s: %w", SchemeGroupVersion, err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.APIPath = "/apis"
	cfg.GroupVersion = &SchemeGroupVersion
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.AcceptContentTypes = runtime.ContentTypeJSON
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%s client: %w", SchemeGroupVersion, err)
	}
	return rc, runtime.NewParameterCodec(s), nil
}
