package main

import (
	"fmt"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeScaleChart draws one panel per cost: a line per store over the
// object counts, both axes logarithmic, so that a linear cost is a line of
// slope 1 and a flat one a horizontal line whatever the units.
func (h *harness) writeScaleChart(path string, metrics []scaleMetric) error {
	const cols = 2
	var rows [][]*plot.Plot
	for i, m := range metrics {
		if i%cols == 0 {
			rows = append(rows, nil)
		}
		p, err := h.scalePanel(m)
		if err != nil {
			return err
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], p)
	}
	if last := rows[len(rows)-1]; len(last) < cols {
		// plot.Align wants full rows: an empty panel fills the gap.
		e := plot.New()
		e.HideAxes()
		rows[len(rows)-1] = append(last, e)
	}
	return writeGrid(path, rows, cols, 2.6*vg.Inch, vg.Points(20))
}

// scalePanel is one metric's panel.
func (h *harness) scalePanel(m scaleMetric) (*plot.Plot, error) {
	p := plot.New()
	p.Add(plotter.NewGrid())
	// The table's note on bracketed per-object figures means nothing here.
	unit, _, _ := strings.Cut(m.unit, " (bytes per object")
	p.Title.Text = fmt.Sprintf("%s\n%s", m.title, unit)
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "objects"
	p.X.Label.TextStyle.Font.Size = vg.Points(8)
	p.X.Tick.Label.Font.Size = vg.Points(8)
	p.Y.Tick.Label.Font.Size = vg.Points(8)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range h.scale.Stores {
		var xys plotter.XYs
		for _, pt := range h.scale.pointsOf(s) {
			v := m.value(pt)
			// Only what the growth is classified on: a list of the 10k
			// objects of the first point is a smaller list, not a point of
			// the curve.
			if math.IsNaN(v) || v <= 0 || math.IsNaN(m.cost(pt)) {
				continue
			}
			xys = append(xys, plotter.XY{X: float64(pt.Objects), Y: v})
			lo, hi = min(lo, v), max(hi, v)
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("scale chart %s: %w", m.key, err)
		}
		line.Color, points.Color = storeColors[s], storeColors[s]
		line.Width = vg.Points(1.5)
		p.Add(line, points)
		p.Legend.Add(s, line, points)
	}
	minX, maxX := math.Inf(1), math.Inf(-1)
	for _, n := range h.scale.Points {
		minX, maxX = min(minX, float64(n)), max(maxX, float64(n))
	}
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, formattedTicks{plot.LogTicks{Prec: -1}, func(v float64) string { return objects(int(math.Round(v))) }}
	p.X.Min, p.X.Max = minX/1.5, maxX*1.5
	if math.IsInf(lo, 1) {
		// Nothing measured: a log axis needs a positive range anyway.
		p.Title.Text += " (no data)"
		lo, hi = 1, 10
	}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, formattedTicks{plot.LogTicks{Prec: -1}, m.format}
	// At least a decade of y, so a flat cost looks flat and the log ticks
	// have a label to show.
	mid := math.Sqrt(lo * hi)
	if hi/lo < 10 {
		lo, hi = mid/math.Sqrt(10), mid*math.Sqrt(10)
	}
	p.Y.Min, p.Y.Max = lo/1.2, hi*1.2
	return p, nil
}

// formattedTicks labels log ticks in the metric's own format (MiB, s, ms)
// instead of 1e+08.
type formattedTicks struct {
	plot.LogTicks
	format func(float64) string
}

func (t formattedTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := t.LogTicks.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = t.format(ticks[i].Value)
		}
	}
	return ticks
}
