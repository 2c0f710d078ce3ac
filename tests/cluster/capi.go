package main

// Cluster API on the control plane (--cluster-api): its real core manager (capi-manager,
// built from sigs.k8s.io/cluster-api by tests/cluster/build) as a child process, and what
// its release installs (core-components.yaml, made by kustomize from the module's own
// core/config/default), localized for a process on loopback:
//
//   - every webhook's and every CRD conversion's clientConfig names
//     https://127.0.0.1:<port>/<path> (a free port per control plane: the URLs live in
//     cluster-scoped objects, and two control planes run at once) with the CA bundle of
//     this cluster's CA, which signs the manager's serving certificate;
//   - cert-manager's Certificate and Issuer are left out (the certificate is made here),
//     and so is the Deployment (the manager runs as a process of this program);
//   - the CRDs are installed with those of --crds, before the controllers start, and the
//     Namespace, RBAC, Service and webhook configurations are applied as they are.
//
// The manager is ready when its /readyz answers and the API server reaches its webhooks
// (two dry-run creates, through the admission webhooks and the conversion webhook).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// capiFeatureGates are the manager's feature gates: MachinePool is on by default in
// v1.14 (beta), ClusterTopology (alpha, ClusterClass) is off by default.
const capiFeatureGates = "ClusterTopology=true,MachinePool=true"

// maxComponentsFile bounds the components YAML (v1.14's is about 1.2 MB).
const maxComponentsFile = 64 << 20

// capiComponents is the localized core-components.yaml.
type capiComponents struct {
	crds    []*apiextensionsv1.CustomResourceDefinition
	objects []*unstructured.Unstructured // Namespace first, then the rest in file order
	dropped []string                     // what was left out, for the log
}

// readCAPIComponents reads the components file and localizes it for a manager serving
// its webhooks at https://127.0.0.1:port with a certificate of the CA caPEM.
func readCAPIComponents(path string, port int, caPEM []byte) (*capiComponents, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := &capiComponents{}
	var namespaces, rest []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(f, maxComponentsFile), 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue // an empty document
		}
		gvk := obj.GroupVersionKind()
		what := gvk.Kind + " " + obj.GetName()
		switch {
		case gvk.Group == "cert-manager.io":
			out.dropped = append(out.dropped, what)
			continue
		case gvk.Group == "apps" && gvk.Kind == "Deployment":
			out.dropped = append(out.dropped, what)
			continue
		}
		dropCAInjection(obj)
		labelAsClusterctlDoes(obj)
		switch {
		case gvk.Group == "apiextensions.k8s.io" && gvk.Kind == "CustomResourceDefinition":
			if err := localizeClientConfig(obj, port, caPEM, "spec", "conversion", "webhook", "clientConfig"); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, what, err)
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, crd); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, what, err)
			}
			out.crds = append(out.crds, crd)
			continue
		case gvk.Group == "admissionregistration.k8s.io" &&
			(gvk.Kind == "MutatingWebhookConfiguration" || gvk.Kind == "ValidatingWebhookConfiguration"):
			hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
			for i, h := range hooks {
				hook, ok := h.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s: %s: webhook %d is not an object", path, what, i)
				}
				if err := localizeClientConfig(&unstructured.Unstructured{Object: hook}, port, caPEM, "clientConfig"); err != nil {
					return nil, fmt.Errorf("%s: %s: webhook %v: %w", path, what, hook["name"], err)
				}
				hooks[i] = hook
			}
			if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
				return nil, err
			}
		}
		// The Deployment's arguments hold clusterctl's variables; nothing applied here
		// may (clusterctl would substitute them, this program does not).
		data, err := json.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(data), "${") {
			return nil, fmt.Errorf("%s: %s holds a clusterctl variable (${…}), which captf-envtest does not substitute", path, what)
		}
		if gvk.Group == "" && gvk.Kind == "Namespace" {
			namespaces = append(namespaces, obj)
		} else {
			rest = append(rest, obj)
		}
	}
	if len(out.crds) == 0 {
		return nil, fmt.Errorf("%s: no CustomResourceDefinition in it: is it Cluster API's core-components.yaml?", path)
	}
	inventoryCRD, provider, err := readInventory(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	out.crds = append(out.crds, inventoryCRD)
	out.objects = append(append(namespaces, rest...), provider)
	return out, nil
}

// readInventory reads clusterctl's inventory CRD (clusterctl-api.yaml, which clusterctl
// init installs before any provider) and the release's version from dir, and makes the
// inventory entry clusterctl init writes for the core provider it installed (its
// components.InventoryObject: named by the provider's manifest label, in the provider's
// namespace, with clusterctl's labels). With it, clusterctl sees Cluster API as installed
// by clusterctl: init adds a provider beside it instead of installing the core again,
// and delete and move find it.
func readInventory(dir string) (*apiextensionsv1.CustomResourceDefinition, *unstructured.Unstructured, error) {
	crdPath := filepath.Join(dir, "clusterctl-api.yaml")
	f, err := os.Open(crdPath)
	if err != nil {
		return nil, nil, fmt.Errorf("clusterctl's inventory CRD: %w (tests/cluster/build copies it beside core-components.yaml)", err)
	}
	defer f.Close()
	obj := map[string]any{}
	if err := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(f, maxComponentsFile), 4096).Decode(&obj); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crdPath, err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, crd); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crdPath, err)
	}
	if crd.Spec.Names.Kind != "Provider" {
		return nil, nil, fmt.Errorf("%s: not clusterctl's Provider CRD (kind %q)", crdPath, crd.Spec.Names.Kind)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "version"))
	if err != nil {
		return nil, nil, fmt.Errorf("the Cluster API release's version: %w (tests/cluster/build writes it beside core-components.yaml)", err)
	}
	version := strings.TrimSpace(string(raw))
	if !strings.HasPrefix(version, "v") {
		return nil, nil, fmt.Errorf("%s: %q is not a release version", filepath.Join(dir, "version"), version)
	}
	provider := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion":   "clusterctl.cluster.x-k8s.io/v1alpha3",
		"kind":         "Provider",
		"providerName": "cluster-api",
		"type":         "CoreProvider",
		"version":      version,
	}}
	provider.SetNamespace("capi-system")
	provider.SetName("cluster-api")
	labelAsClusterctlDoes(provider)
	labels := provider.GetLabels()
	labels["clusterctl.cluster.x-k8s.io/core"] = "inventory"
	provider.SetLabels(labels)
	return crd, provider, nil
}

// labelAsClusterctlDoes puts on obj the labels clusterctl init puts on every component
// it installs: clusterctl's own (clusterctl move finds the kinds to move by it on their
// CRDs; without it the Cluster kind is not discovered and a move fails) and the
// provider's name.
func labelAsClusterctlDoes(obj *unstructured.Unstructured) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["clusterctl.cluster.x-k8s.io"] = ""
	labels["cluster.x-k8s.io/provider"] = "cluster-api"
	obj.SetLabels(labels)
}

// dropCAInjection removes cert-manager's CA injection annotation (the CA bundle is set here).
func dropCAInjection(obj *unstructured.Unstructured) {
	a := obj.GetAnnotations()
	if _, ok := a["cert-manager.io/inject-ca-from"]; ok {
		delete(a, "cert-manager.io/inject-ca-from")
		obj.SetAnnotations(a)
	}
}

// localizeClientConfig makes the clientConfig at fields (when there is one) name the
// manager on loopback: url https://127.0.0.1:port plus the Service's path, and caBundle.
func localizeClientConfig(obj *unstructured.Unstructured, port int, caPEM []byte, fields ...string) error {
	cc, found, err := unstructured.NestedMap(obj.Object, fields...)
	if err != nil || !found {
		return err
	}
	path := "/"
	if svc, ok := cc["service"].(map[string]any); ok {
		if p, ok := svc["path"].(string); ok && p != "" {
			path = p
		}
	} else if _, ok := cc["url"]; !ok {
		return fmt.Errorf("%s names neither a service nor a url", strings.Join(fields, "."))
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	cc = map[string]any{
		"url":      fmt.Sprintf("https://127.0.0.1:%d%s", port, path),
		"caBundle": base64Std(caPEM),
	}
	return unstructured.SetNestedMap(obj.Object, cc, fields...)
}

// applyObjects server-side applies objects other than CRDs (the components', those of
// --objects), in order.
func (c *cluster) applyObjects(ctx context.Context, objs []*unstructured.Unstructured) error {
	cfg, err := c.restConfig()
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	groups, err := restmapper.GetAPIGroupResources(disc)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		// A kind whose CRD was established a moment ago may not be in discovery yet on a
		// loaded API server ("no matches for kind", seen in a test run with a static
		// build beside it): discovery is read again until it is, or the wait runs out.
		var m *meta.RESTMapping
		if err := c.poll(ctx, "the API server to serve "+gvk.String(), func() (bool, error) {
			var err error
			m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if !meta.IsNoMatchError(err) {
				return err == nil, err
			}
			if groups, err := restmapper.GetAPIGroupResources(disc); err == nil {
				mapper = restmapper.NewDiscoveryRESTMapper(groups)
			}
			return false, nil
		}); err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "captf-envtest", Force: true}); err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
	return nil
}

// waitCAPIManager waits for the manager's /readyz, then for its webhooks to answer the
// API server: a dry-run create of a v1beta2 Cluster goes through the Cluster's defaulting
// and validating webhooks, and one of a v1beta1 ClusterResourceSet is converted to
// v1beta2 (the storage version) and back by the conversion webhook. (A v1beta1 Cluster
// would not do: converting its infrastructureRef back to v1beta1 needs the referenced
// kind's CRD.)
func (c *cluster) waitCAPIManager(ctx context.Context, healthURL string) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	if err := c.poll(ctx, "the Cluster API manager's "+healthURL, func() (bool, error) {
		resp, err := hc.Get(healthURL)
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return err
	}
	cfg, err := c.restConfig()
	if err != nil {
		return err
	}
	cfg.WarningHandler = rest.NoWarnings{} // v1beta1 is deprecated, as it should be
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	const name = "captf-envtest-webhook-check"
	probes := []struct {
		gvr schema.GroupVersionResource
		obj map[string]any
	}{
		{
			schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters"},
			map[string]any{
				"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
				"metadata": map[string]any{"name": name},
				"spec": map[string]any{"infrastructureRef": map[string]any{
					"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "CheckCluster", "name": name,
				}},
			},
		},
		{
			schema.GroupVersionResource{Group: "addons.cluster.x-k8s.io", Version: "v1beta1", Resource: "clusterresourcesets"},
			map[string]any{
				"apiVersion": "addons.cluster.x-k8s.io/v1beta1", "kind": "ClusterResourceSet",
				"metadata": map[string]any{"name": name},
				"spec": map[string]any{
					"clusterSelector": map[string]any{"matchLabels": map[string]any{"captf-envtest": "webhook-check"}},
					"resources":       []any{map[string]any{"kind": "Secret", "name": name}},
				},
			},
		},
	}
	var last error
	err = c.poll(ctx, "the Cluster API webhooks to answer the API server", func() (bool, error) {
		for _, p := range probes {
			obj := &unstructured.Unstructured{Object: p.obj}
			_, last = dyn.Resource(p.gvr).Namespace("default").Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if last != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w; the last answer: %v", err, last)
	}
	return err
}

func (c *cluster) restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(c.adminCfg)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "captf-envtest"
	return cfg, nil
}
