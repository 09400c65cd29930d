// Command release writes this repository's modules, at one version, into a
// directory in the layout of a module proxy (what GOPROXY=file://DIR reads):
// for each module, its .info, .mod and .zip under
// DIR/<module path>/@v/, and the version in its list. The zips are made
// from a git revision (the committed files only), as the go command makes
// them when it fetches a tagged module.
//
//	go run . -repo ../.. -dir DIR -version v0.1.0 [-rev HEAD] . txlockprom txlockotel
//
// scripts/release.sh uses it for the publication check and for tidying the
// modules against a version before it is tagged; RELEASING.md tells the
// procedure.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root")
	dir := flag.String("dir", "", "the proxy directory to write into (required)")
	version := flag.String("version", "", "the version to publish the modules at, such as v0.1.0 (required)")
	rev := flag.String("rev", "HEAD", "the git revision to publish")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: release -dir DIR -version vX.Y.Z [-repo DIR] [-rev REV] MODULE_DIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*repo, *dir, *version, *rev, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(repo, dir, version, rev string, subdirs []string) error {
	switch {
	case dir == "":
		return errors.New("-dir is required")
	case !semver.IsValid(version) || semver.Canonical(version) != version:
		return fmt.Errorf("-version %q is not a canonical semantic version such as v0.1.0", version)
	case len(subdirs) == 0:
		return errors.New("name at least one module directory")
	}
	root, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	for _, sub := range subdirs {
		sub = path.Clean(filepath.ToSlash(sub))
		if sub == "." {
			sub = ""
		}
		if err := publish(root, dir, version, rev, sub); err != nil {
			return fmt.Errorf("module in %q: %w", sub, err)
		}
	}
	return nil
}

// publish writes the module in subdir of the repository at root, at rev, as
// version into the proxy directory dir.
func publish(root, dir, version, rev, subdir string) error {
	gomod, err := gitShow(root, rev, path.Join(subdir, "go.mod"))
	if err != nil {
		return err
	}
	f, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return err
	}
	if f.Module == nil {
		return errors.New("go.mod names no module")
	}
	m := module.Version{Path: f.Module.Mod.Path, Version: version}
	if len(f.Replace) > 0 {
		// A consumer's build ignores replace: what it points at would be
		// missing there.
		return fmt.Errorf("%s has replace directives, which a consumer's build ignores: %v", m.Path, f.Replace[0].Old)
	}
	escaped, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	at := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	var zip bytes.Buffer
	if err := modzip.CreateFromVCS(&zip, m, root, rev, subdir); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{version + ".zip": zip.Bytes(), version + ".mod": gomod, version + ".info": info} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(at, "list")
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	if err := os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("published %s@%s (%d bytes)\n", m.Path, version, zip.Len())
	return nil
}

// gitShow returns the file at path in rev of the repository at root.
func gitShow(root, rev, file string) ([]byte, error) {
	cmd := exec.Command("git", "-C", root, "show", rev+":"+file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git show %s:%s: %w: %s", rev, file, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
