def test_it_shows_the_training_page_to_viewers_only(client, viewer):
    assert client.get("/training/").status_code == 302
    client.force_login(viewer)
    response = client.get("/training/")
    assert response.status_code == 200
    assert b"Training jobs" in response.content
