// kubectl's YAML, for the tests: each JSON document on standard input (a JSON array of
// them) is decoded and printed as `kubectl get -o yaml` prints an object, through the same
// code: unstructured.UnstructuredJSONScheme, then sigs.k8s.io/yaml's Marshal (json.Marshal,
// then go-yaml v2), at the versions k8s.io/kubernetes v1.35.4 requires (../go.mod). The
// output is a JSON array of the YAML texts, in order ("" and a message on standard error
// for a document kubectl could not print). Test-only: the product is Python.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var docs []json.RawMessage
	if err := json.Unmarshal(in, &docs); err != nil {
		fmt.Fprintln(os.Stderr, "standard input is not a JSON array:", err)
		os.Exit(1)
	}
	out := make([]string, len(docs))
	for i, doc := range docs {
		// what `kubectl get` holds and prints: an Unstructured (or UnstructuredList)
		obj, err := runtime.Decode(unstructured.UnstructuredJSONScheme, doc)
		if err == nil {
			var text []byte
			text, err = yaml.Marshal(obj) // kubectl's printers.YAMLPrinter
			out[i] = string(text)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d: %v\n", i, err)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
