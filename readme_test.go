package idem_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetSources are the compiled Go files the README's snippets come from:
// the Example functions of every package and the example programs. Each is
// built by the test run, so a snippet found in one of them compiles.
var snippetSources = []string{"example*_test.go", "*/example*_test.go", "examples/*/main.go"}

// TestReadmeSnippets fails when a Go snippet of README.md is not, line for
// line (indentation aside), a run of lines of one of the snippetSources: an
// API change that breaks a snippet breaks its source's build, and a snippet
// edited away from its source fails here.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := fencedBlocks(string(readme), "go")
	if len(snippets) == 0 {
		t.Fatal("README.md has no Go snippet")
	}
	sources := map[string][]string{}
	for _, pattern := range snippetSources {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sources[f] = trimLines(string(b))
		}
	}
	if len(sources) < 5 {
		t.Fatalf("found %d source files for the snippets; run the test from the repository's root", len(sources))
	}
	for _, s := range snippets {
		want := trimLines(s.text)
		found := ""
		for f, lines := range sources {
			if containsRun(lines, want) {
				found = f
				break
			}
		}
		if found == "" {
			t.Errorf("README.md line %d: this snippet is in no example (%s); copy it from one that compiles:\n%s",
				s.line, strings.Join(snippetSources, ", "), s.text)
		}
	}
}

// TestFencedBlocks checks the README parser on a README-like text, so that
// TestReadmeSnippets cannot pass by finding nothing to compare.
func TestFencedBlocks(t *testing.T) {
	text := "# t\n\n```go\na := 1\n\n\tb := 2\n```\n\n```sh\nls\n```\n```go\nc()\n```\n"
	got := fencedBlocks(text, "go")
	if len(got) != 2 || got[0].text != "a := 1\n\n\tb := 2" || got[0].line != 4 || got[1].text != "c()" || got[1].line != 13 {
		t.Fatalf("fencedBlocks = %+v", got)
	}
	lines := trimLines("x\n\ty := 1\n\tz()\n")
	if !containsRun(lines, trimLines("y := 1\n  z()")) || containsRun(lines, trimLines("y := 1\nx")) {
		t.Fatal("containsRun does not match runs of trimmed lines")
	}
}

type block struct {
	text string
	line int // of the block's first line of code, from 1
}

var fence = regexp.MustCompile("^```([a-z]*)\\s*$")

// fencedBlocks returns the code blocks of a markdown text fenced with
// ```lang.
func fencedBlocks(text, lang string) []block {
	var blocks []block
	var cur []string
	in, keep, start := false, false, 0
	for i, l := range strings.Split(text, "\n") {
		m := fence.FindStringSubmatch(l)
		switch {
		case m != nil && !in:
			in, keep, start, cur = true, m[1] == lang, i+2, nil
		case m != nil && in && m[1] == "":
			if keep {
				blocks = append(blocks, block{text: strings.Join(cur, "\n"), line: start})
			}
			in = false
		case in:
			cur = append(cur, l)
		}
	}
	return blocks
}

func trimLines(s string) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return lines
}

// containsRun reports whether want appears in lines as consecutive lines.
func containsRun(lines, want []string) bool {
	for i := 0; i+len(want) <= len(lines); i++ {
		match := true
		for j, w := range want {
			if lines[i+j] != w {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
