// helm-render renders a Helm chart the way `helm template` does, for tests that must run where
// Helm itself is not packaged (Debian 12): Go's text/template with the Sprig function library
// (Debian's golang-github-masterminds-sprig-dev) plus Helm's own functions (include, tpl,
// required, toYaml, fromYaml, toJson, fromJson, lookup) and built-in objects (.Values,
// .Release, .Chart, .Capabilities, .Template, .Files).
//
// Usage:
//
//	helm-render [flags] CHART_DIR
//	  -name RELEASE -namespace NS -f values.yaml (repeatable) -set a.b=v (repeatable)
//	  -kube-version 1.29.0 -api-versions monitoring.coreos.com/v1 (repeatable)
//	  -output yaml|json -strict -notes -lookup objects.yaml
//
// -lookup names a YAML or JSON list of Kubernetes objects that `lookup` finds (as if they were in
// the cluster: an upgrade), matched by apiVersion, kind, namespace and name; without it `lookup`
// finds nothing, as under `helm template` or a first install.
// -output json prints [{"source": "chart/templates/x.yaml", "manifest": {...}}, ...], one entry
// per YAML document. -strict fails on references to values that do not exist.
// Build: deploy/helm/render/build.sh OUT_DIR (offline, from Debian's Go packages).
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// ChartMeta is Chart.yaml, exposed as .Chart with Helm's capitalised field names.
type ChartMeta struct {
	APIVersion   string            `json:"apiVersion"`
	Name         string            `json:"name"`
	Version      string            `json:"version"`
	AppVersion   string            `json:"appVersion"`
	Description  string            `json:"description"`
	Type         string            `json:"type"`
	KubeVersion  string            `json:"kubeVersion"`
	Home         string            `json:"home"`
	Icon         string            `json:"icon"`
	Keywords     []string          `json:"keywords"`
	Sources      []string          `json:"sources"`
	Annotations  map[string]string `json:"annotations"`
	Deprecated   bool              `json:"deprecated"`
	Dependencies []interface{}     `json:"dependencies"`
	Maintainers  []interface{}     `json:"maintainers"`
}

type Release struct {
	Name      string
	Namespace string
	Service   string
	IsInstall bool
	IsUpgrade bool
	Revision  int
}

type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

type APIVersions []string

// Has reports whether an API version ("apps/v1") or resource ("apps/v1/Deployment") is known.
func (a APIVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions APIVersions
	HelmVersion map[string]string
}

type TemplateInfo struct {
	Name     string
	BasePath string
}

// Files is .Files: the chart's non-template files.
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f[name]) }
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for name, data := range f {
		if ok, _ := path.Match(pattern, name); ok {
			out[name] = data
		}
	}
	return out
}
func (f Files) names() []string {
	var n []string
	for name := range f {
		n = append(n, name)
	}
	sort.Strings(n)
	return n
}
func (f Files) AsConfig() string {
	m := map[string]string{}
	for _, name := range f.names() {
		m[path.Base(name)] = string(f[name])
	}
	return toYAML(m)
}
func (f Files) AsSecrets() string {
	m := map[string]string{}
	for _, name := range f.names() {
		m[path.Base(name)] = base64.StdEncoding.EncodeToString(f[name])
	}
	return toYAML(m)
}
func (f Files) Lines(name string) []string {
	s := strings.TrimSuffix(string(f[name]), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// mergeValues deep-merges src over dst (maps merge, everything else replaces; null deletes).
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sv, sok := v.(map[string]interface{})
		dv, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = mergeValues(dv, sv)
		} else {
			dst[k] = v
		}
	}
	return dst
}

// setValue applies one --set a.b.c=value (value typed like Helm: int, bool, null or string).
func setValue(values map[string]interface{}, assignment string) error {
	eq := strings.Index(assignment, "=")
	if eq <= 0 {
		return fmt.Errorf("--set %q: want key=value", assignment)
	}
	keys := strings.Split(assignment[:eq], ".")
	raw := assignment[eq+1:]
	var v interface{} = raw
	if i, err := strconv.ParseInt(raw, 10, 64); err == nil {
		v = i
	} else if raw == "true" || raw == "false" {
		v = raw == "true"
	} else if raw == "null" {
		v = nil
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	if v == nil {
		delete(m, keys[len(keys)-1])
	} else {
		m[keys[len(keys)-1]] = v
	}
	return nil
}

func readYAMLFile(name string) (map[string]interface{}, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return m, nil
}

// helmignore holds .helmignore patterns (glob on the base name or the relative path).
type helmignore []string

func (h helmignore) ignored(rel string, isDir bool) bool {
	for _, p := range h {
		dirOnly := strings.HasSuffix(p, "/")
		p = strings.TrimSuffix(p, "/")
		if dirOnly && !isDir {
			continue
		}
		if ok, _ := path.Match(p, path.Base(rel)); ok {
			return true
		}
		if ok, _ := path.Match(p, rel); ok {
			return true
		}
	}
	return false
}

// loadChart reads every file of the chart, following symbolic links like Helm does.
func loadChart(dir string) (map[string][]byte, error) {
	var ignore helmignore
	if data, err := os.ReadFile(filepath.Join(dir, ".helmignore")); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "#") {
				ignore = append(ignore, line)
			}
		}
	}
	files := map[string][]byte{}
	var walk func(abs, rel string) error
	walk = func(abs, rel string) error {
		entries, err := os.ReadDir(abs)
		if err != nil {
			return err
		}
		for _, e := range entries {
			childAbs := filepath.Join(abs, e.Name())
			childRel := path.Join(rel, e.Name())
			info, err := os.Stat(childAbs) // follows links
			if err != nil {
				return err
			}
			if ignore.ignored(childRel, info.IsDir()) {
				continue
			}
			if info.IsDir() {
				if err := walk(childAbs, childRel); err != nil {
					return err
				}
				continue
			}
			data, err := os.ReadFile(childAbs)
			if err != nil {
				return err
			}
			files[childRel] = data
		}
		return nil
	}
	return files, walk(dir, "")
}

type manifest struct {
	Source   string      `json:"source"`
	Manifest interface{} `json:"manifest"`
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

func run() error {
	var valueFiles, sets, apiVersions listFlag
	name := flag.String("name", "release-name", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	kubeVersion := flag.String("kube-version", "1.29.0", "Kubernetes version for .Capabilities")
	output := flag.String("output", "yaml", "yaml or json")
	strict := flag.Bool("strict", false, "fail on references to missing values")
	notes := flag.Bool("notes", false, "print the rendered NOTES.txt instead of the manifests")
	lookupFile := flag.String("lookup", "", "YAML/JSON list of objects that lookup finds")
	flag.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	flag.Var(&sets, "set", "key.path=value (repeatable; after the files)")
	flag.Var(&apiVersions, "api-versions", "extra API versions for .Capabilities (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("usage: helm-render [flags] CHART_DIR")
	}
	chartDir := flag.Arg(0)
	files, err := loadChart(chartDir)
	if err != nil {
		return err
	}
	var meta ChartMeta
	if err := yaml.Unmarshal(files["Chart.yaml"], &meta); err != nil || meta.Name == "" {
		return fmt.Errorf("Chart.yaml: invalid (%v)", err)
	}
	values := map[string]interface{}{}
	if err := yaml.Unmarshal(files["values.yaml"], &values); err != nil {
		return fmt.Errorf("values.yaml: %v", err)
	}
	for _, f := range valueFiles {
		m, err := readYAMLFile(f)
		if err != nil {
			return err
		}
		values = mergeValues(values, m)
	}
	for _, s := range sets {
		if err := setValue(values, s); err != nil {
			return err
		}
	}

	kv := strings.TrimPrefix(*kubeVersion, "v")
	parts := strings.SplitN(kv, ".", 3)
	if len(parts) < 2 {
		return fmt.Errorf("-kube-version %q: want MAJOR.MINOR[.PATCH]", *kubeVersion)
	}
	apis := APIVersions{"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
		"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1",
		"apps/v1/Deployment", "apps/v1/StatefulSet", "policy/v1/PodDisruptionBudget",
		"autoscaling/v2/HorizontalPodAutoscaler"}
	apis = append(apis, apiVersions...)
	caps := Capabilities{
		KubeVersion: KubeVersion{Version: "v" + kv, Major: parts[0], Minor: parts[1], GitVersion: "v" + kv},
		APIVersions: apis,
		HelmVersion: map[string]string{"Version": "v3.14.0-helm-render"},
	}

	// Every template file joins one set, named chart/templates/..., so that `define`s in
	// partials are visible to all (as in Helm).
	root := template.New("gotpl")
	if *strict {
		root.Option("missingkey=error")
	} else {
		root.Option("missingkey=zero")
	}
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["toJson"] = toJSON
	funcs["fromJson"] = fromJSON
	funcs["fromYamlArray"] = func(s string) []interface{} {
		var a []interface{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			return []interface{}{err.Error()}
		}
		return a
	}
	funcs["fromJsonArray"] = func(s string) []interface{} {
		var a []interface{}
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			return []interface{}{err.Error()}
		}
		return a
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	existing, err := readObjects(*lookupFile)
	if err != nil {
		return err
	}
	funcs["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return lookup(existing, apiVersion, kind, namespace, name), nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf strings.Builder
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	root.Funcs(funcs)

	var templates []string
	other := Files{}
	for rel, data := range files {
		if strings.HasPrefix(rel, "templates/") {
			templates = append(templates, rel)
			full := meta.Name + "/" + rel
			if _, err := root.New(full).Parse(string(data)); err != nil {
				return err
			}
		} else if rel != "values.yaml" && rel != "Chart.yaml" {
			other[rel] = data
		}
	}
	sort.Strings(templates)

	var out []manifest
	var yamlOut strings.Builder
	for _, rel := range templates {
		base := path.Base(rel)
		isNotes := base == "NOTES.txt"
		if strings.HasPrefix(base, "_") || isNotes != *notes {
			continue
		}
		if !isNotes && !strings.HasSuffix(base, ".yaml") && !strings.HasSuffix(base, ".yml") {
			continue
		}
		full := meta.Name + "/" + rel
		data := map[string]interface{}{
			"Values":       values,
			"Release":      Release{Name: *name, Namespace: *namespace, Service: "Helm", IsInstall: true, Revision: 1},
			"Chart":        meta,
			"Capabilities": caps,
			"Template":     TemplateInfo{Name: full, BasePath: meta.Name + "/templates"},
			"Files":        other,
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, full, data); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if isNotes {
			fmt.Print(text)
			continue
		}
		for _, doc := range docSeparator.Split(text, -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var obj interface{}
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return fmt.Errorf("%s: rendered invalid YAML: %v\n%s", full, err, doc)
			}
			if err := json.Unmarshal(js, &obj); err != nil {
				return fmt.Errorf("%s: %v", full, err)
			}
			if _, ok := obj.(map[string]interface{}); !ok {
				return fmt.Errorf("%s: a document that is not a mapping:\n%s", full, doc)
			}
			out = append(out, manifest{Source: full, Manifest: obj})
			fmt.Fprintf(&yamlOut, "---\n# Source: %s\n%s\n", full, strings.Trim(doc, "\n"))
		}
	}
	if *notes {
		return nil
	}
	if *output == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Print(yamlOut.String())
	return nil
}

// readObjects reads the -lookup file: a list of objects (none without the flag).
func readObjects(name string) ([]map[string]interface{}, error) {
	if name == "" {
		return nil, nil
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var objs []map[string]interface{}
	if err := yaml.Unmarshal(data, &objs); err != nil {
		return nil, fmt.Errorf("-lookup %s: want a list of objects: %v", name, err)
	}
	return objs, nil
}

// lookup is Helm's: the object named, or with an empty name {"items": [...]} of that kind in the
// namespace (every namespace when it is empty); an empty map when nothing matches.
func lookup(objs []map[string]interface{}, apiVersion, kind, namespace, name string) map[string]interface{} {
	var items []interface{}
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]interface{})
		if o["apiVersion"] != apiVersion || o["kind"] != kind || meta == nil {
			continue
		}
		if namespace != "" && meta["namespace"] != namespace {
			continue
		}
		if name == "" {
			items = append(items, o)
		} else if meta["name"] == name {
			return o
		}
	}
	if name == "" && items != nil {
		return map[string]interface{}{"apiVersion": apiVersion, "kind": kind + "List", "items": items}
	}
	return map[string]interface{}{}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteString("\n")
		}
	}
	return b.String()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(1)
	}
}
