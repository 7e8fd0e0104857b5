// policycheck decodes a DeschedulerPolicy file the way the descheduler pinned in this module reads it, but
// strictly: a key its v1alpha2 types do not have (misspelt, wrongly cased, misplaced) is an error here, where the
// descheduler itself drops it without a word. Then, unless -structure-only, it loads the policy through the
// descheduler's own LoadPolicyConfig with its default plugins registered, so unknown plugins, plugin args its
// types do not have and invalid values fail as they would at the descheduler's start.
//
// Usage: policycheck [-structure-only] FILE. Exit 0: the descheduler reads every key; 1: it would not.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/fake"

	"sigs.k8s.io/descheduler/pkg/api"
	"sigs.k8s.io/descheduler/pkg/api/v1alpha2"
	"sigs.k8s.io/descheduler/pkg/descheduler"
	"sigs.k8s.io/descheduler/pkg/descheduler/scheme"
	"sigs.k8s.io/descheduler/pkg/framework/pluginregistry"
)

func main() {
	structureOnly := flag.Bool("structure-only", false,
		"only the strict decode of the policy's own keys (for plugins this descheduler does not have)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: policycheck [-structure-only] FILE")
		os.Exit(2)
	}
	file := flag.Arg(0)
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !*structureOnly {
		descheduler.SetupPlugins() // the registry the descheduler's main fills; plugin args decode against it
	} else {
		pluginregistry.PluginRegistry = pluginregistry.NewRegistry()
	}
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	decoder := strict.UniversalDecoder(v1alpha2.SchemeGroupVersion, api.SchemeGroupVersion)
	if err := runtime.DecodeInto(decoder, data, &api.DeschedulerPolicy{}); err != nil {
		fmt.Fprintf(os.Stderr, "%s: the descheduler would not read it in full: %v\n", file, err)
		os.Exit(1)
	}
	if *structureOnly {
		return
	}
	if _, err := descheduler.LoadPolicyConfig(file, fake.NewSimpleClientset(), pluginregistry.PluginRegistry); err != nil {
		fmt.Fprintf(os.Stderr, "%s: the descheduler refuses it: %v\n", file, err)
		os.Exit(1)
	}
}
