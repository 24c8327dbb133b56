package models

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Tag categories in selected_tags.csv.
const (
	CatGeneral   = 0
	CatCharacter = 4
	CatRating    = 9
)

// Tag is one row of a tagger's label file.
type Tag struct {
	Name     string
	Category int
	IPs      []string
}

// readTags reads selected_tags.csv. The score of row i is output column i unless the file
// has an `id` column, which then gives the column. `ips` (PixAI) is a JSON list.
func readTags(path string) ([]Tag, error) {
	rows, header, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	col := func(name string) int {
		for i, h := range header {
			if h == name {
				return i
			}
		}
		return -1
	}
	iName, iCat, iID, iIPs := col("name"), col("category"), col("id"), col("ips")
	if iName < 0 || iCat < 0 {
		return nil, fmt.Errorf("%s: want columns name and category, got %v", path, header)
	}
	tags := make([]Tag, len(rows))
	for r, row := range rows {
		idx := r
		if iID >= 0 {
			if idx, err = strconv.Atoi(row[iID]); err != nil || idx < 0 || idx >= len(rows) {
				return nil, fmt.Errorf("%s row %d: bad id %q", path, r+2, row[iID])
			}
		}
		cat, err := strconv.Atoi(row[iCat])
		if err != nil {
			return nil, fmt.Errorf("%s row %d: bad category %q", path, r+2, row[iCat])
		}
		t := Tag{Name: row[iName], Category: cat}
		if iIPs >= 0 && row[iIPs] != "" {
			if err := json.Unmarshal([]byte(row[iIPs]), &t.IPs); err != nil {
				return nil, fmt.Errorf("%s row %d: ips is not a JSON list: %v", path, r+2, err)
			}
		}
		tags[idx] = t
	}
	return tags, nil
}

// readThresholds reads thresholds.csv (category,name,threshold) into name -> threshold.
func readThresholds(path string) (map[string]float32, error) {
	rows, header, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	iName, iTh := -1, -1
	for i, h := range header {
		switch h {
		case "name":
			iName = i
		case "threshold":
			iTh = i
		}
	}
	if iName < 0 || iTh < 0 {
		return nil, fmt.Errorf("%s: want columns name and threshold, got %v", path, header)
	}
	out := make(map[string]float32, len(rows))
	for r, row := range rows {
		v, err := strconv.ParseFloat(row[iTh], 32)
		if err != nil {
			return nil, fmt.Errorf("%s row %d: bad threshold %q", path, r+2, row[iTh])
		}
		out[row[iName]] = float32(v)
	}
	return out, nil
}

func readCSV(path string) (rows [][]string, header []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	header, err = r.Read()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	for {
		row, err := r.Read()
		if err == io.EOF {
			return rows, header, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, row)
	}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
