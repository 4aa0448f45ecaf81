package main

import (
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeChurnChart draws every churn store's throughput over time, one line
// per store, with its compactions marked on its line.
func (h *harness) writeChurnChart(path string) error {
	c := &h.churn
	p := plot.New()
	p.Add(plotter.NewGrid())
	p.Title.Text = fmt.Sprintf("Updates per second under churn (%d keys, compaction every %s)", c.keys, c.compactEvery)
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "seconds into the run"
	p.Y.Label.Text = "updates/s"
	p.Y.Min = 0
	p.Legend.Top = true
	for _, s := range c.order {
		r := c.res[s]
		if r == nil || r.Result == nil || len(r.Result.Series) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(r.Result.Series))
		for i, v := range r.Result.Series {
			pts[i] = plotter.XY{X: float64(i+1) * r.Result.SeriesInterval, Y: v}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("churn chart: %w", err)
		}
		line.Color = storeColors[s]
		line.Width = vg.Points(1)
		p.Add(line)
		p.Legend.Add(s, line)
		if len(r.Result.Compactions) > 0 {
			var marks plotter.XYs
			for _, cp := range r.Result.Compactions {
				i := min(len(pts)-1, max(0, int(cp.At/r.Result.SeriesInterval)))
				marks = append(marks, plotter.XY{X: cp.At, Y: pts[i].Y})
			}
			sc, err := plotter.NewScatter(marks)
			if err != nil {
				return fmt.Errorf("churn chart: %w", err)
			}
			sc.Color = storeColors[s]
			sc.Shape = draw.TriangleGlyph{}
			sc.Radius = vg.Points(4)
			p.Add(sc)
			p.Legend.Add(s+" compaction", sc)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("churn chart dir: %w", err)
	}
	if err := p.Save(11*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("churn chart: %w", err)
	}
	return nil
}
