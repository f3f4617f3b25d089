// Command modproxy writes a file-based Go module proxy that serves modules
// of this repository's working tree at one version, so that a module can be
// built outside the workspace against them as they would be published
// (GOPROXY=file://DIR). .ci/modules runs it:
//
//	go run . -version v0.1.0 -o DIR MODDIR...
//
// For each module directory (absolute, or relative to the current directory)
// it writes, under DIR/<module path>/@v/, the module's zip, its go.mod as
// VERSION.mod, VERSION.info and a list naming VERSION. The zip holds the
// files git knows in the directory, tracked or new and not ignored, as they
// are on disk, without the files of nested modules: what a tag of the
// working tree would hold, packed by golang.org/x/mod/zip as the go command
// packs it.
//
// The modules are served as a set tagged together: where one requires
// another at a different version, the go.mod served requires it at VERSION
// (so the check before a release can serve the checkout at the version about
// to be tagged). A go.mod with a replace or exclude directive is refused: the
// go command ignores those directives in a dependency and refuses them in a
// module given to go install or go run with a version.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "", "the version to serve every module at, e.g. v0.1.0 (required)")
	out := flag.String("o", "", "the proxy's directory, created if missing (required)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: modproxy -version VERSION -o DIR MODDIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	mods := make([]*modfile.File, flag.NArg())
	served := make(map[string]bool)
	for i, dir := range flag.Args() {
		mf, err := readGoMod(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
		mods[i] = mf
		served[mf.Module.Mod.Path] = true
	}
	for i, dir := range flag.Args() {
		if err := serve(*out, dir, mods[i], served, *version); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
		fmt.Printf("%s@%s from %s\n", mods[i].Module.Mod.Path, *version, dir)
	}
}

// readGoMod reads and checks the go.mod in dir.
func readGoMod(dir string) (*modfile.File, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	mf, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	if mf.Module == nil {
		return nil, fmt.Errorf("go.mod has no module directive")
	}
	if len(mf.Replace) > 0 || len(mf.Exclude) > 0 {
		return nil, fmt.Errorf("go.mod has replace or exclude directives, which a published module must not have")
	}
	return mf, nil
}

// serve writes the module in dir, whose go.mod is mf, to the proxy in out
// at version, requiring the served modules it requires at version.
func serve(out, dir string, mf *modfile.File, served map[string]bool, version string) error {
	m := module.Version{Path: mf.Module.Mod.Path, Version: version}
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	changed := false
	for _, r := range mf.Require {
		if served[r.Mod.Path] && r.Mod.Version != version {
			if err := mf.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
			changed = true
		}
	}
	if changed {
		if gomod, err = mf.Format(); err != nil {
			return err
		}
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}

	files, err := gitFiles(dir, gomod)
	if err != nil {
		return err
	}
	var zbuf bytes.Buffer
	if err := zip.Create(&zbuf, m, files); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		escVersion + ".zip":  zbuf.Bytes(),
		escVersion + ".mod":  gomod,
		escVersion + ".info": info,
		"list":               []byte(m.Version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// gitFiles lists the files git knows in dir (tracked, or untracked and not
// ignored) that exist on disk, relative to dir, with gomod as the go.mod.
func gitFiles(dir string, gomod []byte) ([]zip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	listing, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	seen := make(map[string]bool)
	var files []zip.File
	for _, name := range strings.Split(string(listing), "\x00") {
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		if name == "go.mod" {
			files = append(files, memFile{path: name, data: gomod})
			continue
		}
		f := file{dir: dir, path: name}
		if _, err := f.Lstat(); err != nil {
			if os.IsNotExist(err) { // deleted in the working tree
				continue
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// file is a file of the working tree, named by its slash-separated path
// relative to the module's directory.
type file struct {
	dir, path string
}

func (f file) Path() string                 { return f.path }
func (f file) Lstat() (fs.FileInfo, error)  { return os.Lstat(f.abs()) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.abs()) }
func (f file) abs() string                  { return filepath.Join(f.dir, filepath.FromSlash(f.path)) }

// memFile is a file held in memory: the go.mod as served.
type memFile struct {
	path string
	data []byte
}

func (f memFile) Path() string                 { return f.path }
func (f memFile) Lstat() (fs.FileInfo, error)  { return memInfo{f}, nil }
func (f memFile) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(f.data)), nil }

// memInfo describes a memFile as a regular file.
type memInfo struct{ f memFile }

func (i memInfo) Name() string       { return path.Base(i.f.path) }
func (i memInfo) Size() int64        { return int64(len(i.f.data)) }
func (i memInfo) Mode() fs.FileMode  { return 0o644 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }
