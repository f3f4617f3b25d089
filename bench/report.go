package main

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/idemkit/idem"
)

// dupRate is the share of operations that reuse a recent key instead of a
// new one (-dups), for the suites whose variants take the key they are given.
var dupRate float64

var (
	recentMu   sync.Mutex
	recentKeys [256]string
	recentN    int
)

// nextKey returns a new key or, with probability dupRate, one used recently:
// a duplicate request.
func nextKey() idem.Key {
	if dupRate > 0 && rand.Float64() < dupRate {
		recentMu.Lock()
		n := min(recentN, len(recentKeys))
		var k string
		if n > 0 {
			k = recentKeys[rand.IntN(n)]
		}
		recentMu.Unlock()
		if k != "" {
			return idem.Key{Scope: "bench", ID: k}
		}
	}
	id := strconv.FormatInt(keySeq.Add(1), 36)
	recentMu.Lock()
	recentKeys[recentN%len(recentKeys)] = id
	recentN++
	recentMu.Unlock()
	return idem.Key{Scope: "bench", ID: id}
}

// result is one row of a comparison, as written to the JSON file: medians
// over the rounds, ratios taken round by round.
type result struct {
	Suite   string  `json:"suite"`
	Variant string  `json:"variant"`
	Dups    float64 `json:"duplicate_share"`
	// RTTMicro is the round-trip time added in front of the servers (-rtt),
	// MeasuredRTTMicro what a SELECT 1 measured it to add.
	RTTMicro         int64   `json:"rtt_us"`
	MeasuredRTTMicro int64   `json:"measured_rtt_us"`
	Workers          int     `json:"workers"`
	OpsPerS          float64 `json:"ops_per_s"`
	// RatioToBare is the ratio to the suite's bare transaction, with its
	// smallest and largest round; Ratio is to the suite's baseline (its
	// first variant, the Redis recipe in the redis suite).
	RatioToBare float64 `json:"ratio_to_bare"`
	RatioMin    float64 `json:"ratio_min"`
	RatioMax    float64 `json:"ratio_max"`
	Ratio       float64 `json:"ratio_to_baseline"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	Rounds      int     `json:"rounds"`
	// ClientCPUMicro and ProxyCPUMicro are the bench's and the delay
	// proxies' CPU time per operation.
	ClientCPUMicro float64 `json:"client_cpu_us_per_op"`
	ProxyCPUMicro  float64 `json:"proxy_cpu_us_per_op"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

var (
	resultsMu sync.Mutex
	results   []result
)

func addResult(r result) {
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()
}

// writeJSON writes the machine description and every result.
func writeJSON(path, postgres, syncCommit string) error {
	host, _ := os.Hostname()
	doc := map[string]any{
		"date":               time.Now().UTC().Format(time.RFC3339),
		"host":               host,
		"cpus":               runtime.NumCPU(),
		"go":                 runtime.Version(),
		"os_arch":            runtime.GOOS + "/" + runtime.GOARCH,
		"postgres":           postgres,
		"synchronous_commit": syncCommit,
		"results":            results,
	}
	if mysqlVersion != "" {
		doc["mysql"] = mysqlVersion
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeChart draws the core suite's throughput against workers, one line per
// variant, for duplicate share 0, as a PNG.
func writeChart(path string) error {
	series := map[string][][2]float64{}
	var names []string
	for _, r := range results {
		if r.Suite != "core" || r.Dups != 0 {
			continue
		}
		if _, ok := series[r.Variant]; !ok {
			names = append(names, r.Variant)
		}
		series[r.Variant] = append(series[r.Variant], [2]float64{float64(r.Workers), r.OpsPerS})
	}
	if len(names) == 0 {
		return fmt.Errorf("-chart: the core suite did not run with -dups 0")
	}
	const w, h, left, right, top, bottom = 900, 520, 80, 200, 40, 60
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	var maxX, maxY float64
	for _, pts := range series {
		for _, p := range pts {
			maxX, maxY = math.Max(maxX, p[0]), math.Max(maxY, p[1])
		}
	}
	maxY = math.Ceil(maxY/1000) * 1000
	// Workers on a log scale: 1, 16, 64 spread evenly.
	xOf := func(x float64) int {
		return left + int(math.Log2(x)/math.Max(math.Log2(maxX), 1)*float64(w-left-right))
	}
	yOf := func(y float64) int { return h - bottom - int(y/maxY*float64(h-top-bottom)) }
	grey := color.RGBA{200, 200, 200, 255}
	black := color.RGBA{0, 0, 0, 255}
	line(img, left, h-bottom, w-right, h-bottom, black)
	line(img, left, top, left, h-bottom, black)
	for y := 0.0; y <= maxY; y += maxY / 5 {
		line(img, left, yOf(y), w-right, yOf(y), grey)
		label(img, 8, yOf(y)+4, fmt.Sprintf("%6.0f", y), black)
	}
	seen := map[float64]bool{}
	for _, pts := range series {
		for _, p := range pts {
			if !seen[p[0]] {
				seen[p[0]] = true
				label(img, xOf(p[0])-6, h-bottom+18, strconv.Itoa(int(p[0])), black)
			}
		}
	}
	label(img, w/2-60, h-15, "workers (log scale)", black)
	label(img, 8, 20, "ops/s, one INSERT per operation (core suite, new keys)", black)
	palette := []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}, {148, 103, 189, 255}}
	slices.Sort(names)
	for i, name := range names {
		c := palette[i%len(palette)]
		pts := series[name]
		slices.SortFunc(pts, func(a, b [2]float64) int { return int(a[0] - b[0]) })
		for j := range pts {
			x, y := xOf(pts[j][0]), yOf(pts[j][1])
			dot(img, x, y, c)
			if j > 0 {
				line(img, xOf(pts[j-1][0]), yOf(pts[j-1][1]), x, y, c)
			}
		}
		line(img, w-right+15, top+20*i+6, w-right+35, top+20*i+6, c)
		label(img, w-right+40, top+20*i+10, name, c)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	steps := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= steps; i++ {
		x := x0 + (x1-x0)*i/steps
		y := y0 + (y1-y0)*i/steps
		img.Set(x, y, c)
		img.Set(x, y+1, c)
	}
}

func dot(img *image.RGBA, x, y int, c color.Color) {
	for dx := -3; dx <= 3; dx++ {
		for dy := -3; dy <= 3; dy++ {
			img.Set(x+dx, y+dy, c)
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func label(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// latencySeries are the lines of the latency chart: a suite's variant,
// drawn as its ratio to the suite's bare transaction.
var latencySeries = []struct{ suite, variant, label string }{
	{"core", "bare", "bare transaction"},
	{"core", "Do", "Do"},
	{"core", "WithIdempotency", "WithIdempotency"},
	{"http", "middleware", "middleware (vs bare handler)"},
	{"redis", "redis recipe", "Redis recipe"},
}

// writeLatencyChart draws, for each worker count, the ratio to a bare
// transaction of bare, Do, WithIdempotency, the middleware and the Redis
// recipe against the added round-trip time (duplicates 0), as a PNG.
func writeLatencyChart(path string) error {
	var rtts []int64
	var workers []int
	for _, r := range results {
		if r.Dups != 0 {
			continue
		}
		if !slices.Contains(rtts, r.RTTMicro) {
			rtts = append(rtts, r.RTTMicro)
		}
		if !slices.Contains(workers, r.Workers) {
			workers = append(workers, r.Workers)
		}
	}
	if len(rtts) < 2 {
		return fmt.Errorf("-chart: the latency chart needs results at two round-trip times or more")
	}
	slices.Sort(rtts)
	slices.Sort(workers)
	// The round trip each setting really added, as measured.
	measuredRTT := map[int64]int64{}
	for _, r := range results {
		measuredRTT[r.RTTMicro] = r.MeasuredRTTMicro
	}
	const panelW, h, left, gap, top, bottom, legend = 300, 480, 60, 30, 50, 90, 230
	w := left + len(workers)*(panelW+gap) + legend
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	grey := color.RGBA{210, 210, 210, 255}
	black := color.RGBA{0, 0, 0, 255}
	palette := []color.RGBA{{90, 90, 90, 255}, {31, 119, 180, 255}, {44, 160, 44, 255}, {255, 127, 14, 255}, {214, 39, 40, 255}}
	const maxY = 1.2
	yOf := func(y float64) int { return h - bottom - int(y/maxY*float64(h-top-bottom)) }
	label(img, 8, 20, "throughput as a ratio to a bare transaction, against the round-trip time added in front of PostgreSQL and Redis", black)
	label(img, 8, 36, "(set, and in parentheses as measured with SELECT 1)", black)
	for pi, wk := range workers {
		x0 := left + pi*(panelW+gap)
		xOf := func(i int) int { return x0 + 20 + i*(panelW-40)/max(len(rtts)-1, 1) }
		line(img, x0, h-bottom, x0+panelW, h-bottom, black)
		line(img, x0, top, x0, h-bottom, black)
		for y := 0.0; y <= maxY+1e-9; y += 0.2 {
			line(img, x0, yOf(y), x0+panelW, yOf(y), grey)
			if pi == 0 {
				label(img, 20, yOf(y)+4, fmt.Sprintf("%.1f", y), black)
			}
		}
		for i, rtt := range rtts {
			text, measured := "loopback", ""
			if rtt > 0 {
				// The chart's font has no µ.
				text = strings.ReplaceAll((time.Duration(rtt) * time.Microsecond).String(), "µ", "u")
				if m := measuredRTT[rtt]; m > 0 {
					measured = "(" + strings.ReplaceAll((time.Duration(m)*time.Microsecond).String(), "µ", "u") + ")"
				}
			}
			label(img, xOf(i)-len(text)*3, h-bottom+16, text, black)
			label(img, xOf(i)-len(measured)*3, h-bottom+30, measured, black)
		}
		label(img, x0+panelW/2-40, h-bottom+50, fmt.Sprintf("%d worker(s)", wk), black)
		for si, s := range latencySeries {
			c := palette[si%len(palette)]
			prev := -1
			var prevY int
			for i, rtt := range rtts {
				j := slices.IndexFunc(results, func(r result) bool {
					return r.Suite == s.suite && r.Variant == s.variant && r.Workers == wk && r.RTTMicro == rtt && r.Dups == 0
				})
				if j < 0 {
					continue
				}
				y := yOf(math.Min(results[j].RatioToBare, maxY))
				dot(img, xOf(i), y, c)
				if prev >= 0 {
					line(img, xOf(prev), prevY, xOf(i), y, c)
				}
				prev, prevY = i, y
			}
		}
	}
	lx := left + len(workers)*(panelW+gap)
	for si, s := range latencySeries {
		c := palette[si%len(palette)]
		line(img, lx, top+22*si+6, lx+20, top+22*si+6, c)
		label(img, lx+26, top+22*si+10, s.label, c)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

// replotChart draws path from the results of an earlier run's JSON file:
// the latency chart when they span several round-trip times, the workers
// chart otherwise.
func replotChart(jsonFile, path string) error {
	if path == "" {
		return fmt.Errorf("-replot needs -chart")
	}
	b, err := os.ReadFile(jsonFile)
	if err != nil {
		return err
	}
	var doc struct {
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", jsonFile, err)
	}
	results = doc.Results
	rtts := map[int64]bool{}
	for _, r := range results {
		rtts[r.RTTMicro] = true
	}
	if len(rtts) > 1 {
		return writeLatencyChart(path)
	}
	return writeChart(path)
}
