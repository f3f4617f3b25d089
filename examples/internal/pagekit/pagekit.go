// Package pagekit holds what the example pages share: their stylesheet and
// panel.js, the script that sends the pages' requests and shows each one in
// the "Behind the scenes" panel.
package pagekit

import (
	"embed"
	"net/http"
)

//go:embed style.css panel.js
var files embed.FS

// Prefix is the path the pages load the shared files from.
const Prefix = "/kit/"

// Handler serves the shared files under Prefix.
func Handler() http.Handler { return http.StripPrefix(Prefix, http.FileServerFS(files)) }
