package main

// CRDs installed before kube-controller-manager starts (--crds): its garbage collector and
// quota controller find the resources of CRDs made later only at their next discovery
// sync (every 30 seconds), as on a real cluster; installing them first makes a fresh
// cluster behave like one whose CRDs were installed long ago.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
)

// maxCRDFile bounds what one file may hold.
const maxCRDFile = 16 << 20

// readCRDs reads every CustomResourceDefinition of the YAML or JSON files named by paths
// (a directory stands for its *.yaml, *.yml and *.json files); other kinds are an error.
func readCRDs(paths []string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(fh, maxCRDFile), 4096)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			err := dec.Decode(crd)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fh.Close()
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if crd.Kind == "" && crd.Name == "" {
				continue // an empty document
			}
			if crd.Kind != "CustomResourceDefinition" {
				fh.Close()
				return nil, fmt.Errorf("%s: a %q is not a CustomResourceDefinition", f, crd.Kind)
			}
			out = append(out, crd)
		}
		fh.Close()
	}
	return out, nil
}

// installCRDs creates (or replaces) the CRDs and waits until each is Established.
func (c *cluster) installCRDs(ctx context.Context, crds []*apiextensionsv1.CustomResourceDefinition) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(c.adminCfg)
	if err != nil {
		return err
	}
	cfg.UserAgent = "captf-envtest"
	client, err := apiextensions.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			old, gerr := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			crd.ResourceVersion = old.ResourceVersion
			_, err = api.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		name := crd.Name
		if err := c.poll(ctx, "CRD "+name+" to be established", func() (bool, error) {
			got, err := api.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// readObjects reads the objects of --objects: YAML or JSON documents, any kind but a
// CustomResourceDefinition (those go to --crds, installed and established first).
func readObjects(paths []string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range paths {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(fh, maxCRDFile), 4096)
		for {
			obj := &unstructured.Unstructured{}
			err := dec.Decode(&obj.Object)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fh.Close()
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(obj.Object) == 0 {
				continue // an empty document
			}
			if obj.GetKind() == "" || obj.GetName() == "" {
				fh.Close()
				return nil, fmt.Errorf("%s: an object without a kind or a name", f)
			}
			if obj.GetKind() == "CustomResourceDefinition" {
				fh.Close()
				return nil, fmt.Errorf("%s: CustomResourceDefinition %s belongs in --crds", f, obj.GetName())
			}
			out = append(out, obj)
		}
		fh.Close()
	}
	return out, nil
}
