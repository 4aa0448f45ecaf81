package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// storeColors keeps each store's colour the same in every panel.
var storeColors = map[string]color.Color{
	storeCeiling: color.RGBA{160, 160, 160, 255},
	storeEtcd:    color.RGBA{66, 133, 244, 255},
	storeBadger:  color.RGBA{219, 68, 55, 255},
	storePebble:  color.RGBA{171, 71, 188, 255},
	storeMemkv:   color.RGBA{244, 160, 0, 255},
	storeWasm:    color.RGBA{15, 157, 88, 255},
}

// writeChart draws, per workload, the median throughput and the median p99
// latency of every store side by side: one row per workload, throughput on
// the left, p99 on the right.
func (h *harness) writeChart(path string, workloads []string, stores []string) error {
	var rows [][]*plot.Plot
	for _, w := range workloads {
		unit := "ops/s"
		var row []*plot.Plot
		for col, metric := range []string{"throughput", "p99"} {
			p := plot.New()
			grid := plotter.NewGrid()
			grid.Vertical.Color = nil // bars, not an x scale
			p.Add(grid)
			var (
				names []string
				top   float64
			)
			for i, s := range stores {
				rs := h.results(s, w)
				if len(rs) == 0 {
					names = append(names, s+" (n/a)")
					continue
				}
				unit = rs[0].Unit
				v := median(rs, func(r resultT) float64 { return r.Throughput })
				if metric == "p99" {
					v = median(rs, func(r resultT) float64 { return r.Latency.P99 })
				}
				bar, err := plotter.NewBarChart(plotter.Values{v}, vg.Points(28))
				if err != nil {
					return fmt.Errorf("chart %s: %w", w, err)
				}
				bar.XMin = float64(i)
				bar.Color = storeColors[s]
				bar.LineStyle.Width = 0
				label, err := plotter.NewLabels(plotter.XYLabels{
					XYs:    plotter.XYs{{X: float64(i), Y: v}},
					Labels: []string{barLabel(v, metric)},
				})
				if err != nil {
					return fmt.Errorf("chart %s: %w", w, err)
				}
				label.Offset = vg.Point{X: -vg.Points(10), Y: vg.Points(2)}
				for i := range label.TextStyle {
					label.TextStyle[i].Font.Size = vg.Points(8)
				}
				p.Add(bar, label)
				top = max(top, v)
				names = append(names, s)
			}
			p.NominalX(names...)
			p.Y.Min = 0
			p.Y.Max = top * 1.2 // room for the value labels
			p.X.Tick.Label.Font.Size = vg.Points(8)
			p.Y.Tick.Label.Font.Size = vg.Points(8)
			if col == 0 {
				p.Title.Text = fmt.Sprintf("%s: throughput (%s, higher is better)", w, unit)
			} else {
				p.Title.Text = fmt.Sprintf("%s: p99 latency (ms, lower is better)", w)
			}
			p.Title.TextStyle.Font.Size = vg.Points(10)
			row = append(row, p)
		}
		rows = append(rows, row)
	}
	return writeGrid(path, rows, 2, 2.2*vg.Inch, vg.Points(16))
}

// writeGrid draws rows of plots, aligned, cols wide and rowHeight tall each
// row, into a PNG at path.
func writeGrid(path string, rows [][]*plot.Plot, cols int, rowHeight, pad vg.Length) error {
	width, height := 11*vg.Inch, vg.Length(len(rows))*rowHeight
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: cols, PadX: pad, PadY: pad,
		PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8)}
	canvases := plot.Align(rows, tiles, dc)
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(canvases[i][j])
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("chart dir: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return f.Close()
}

func barLabel(v float64, metric string) string {
	if metric == "p99" {
		return fms(v)
	}
	return fnum(v)
}
